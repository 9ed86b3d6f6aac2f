"""/api/v1/jobs/, /api/v1/queue/, /api/v1/opcodes/: permissions, 202s, errors."""

import pytest

from jobs import services
from jobs.models import Job, QueueSettings
from tests.jobs.helpers import refresh

pytestmark = pytest.mark.django_db


def test_users_list_their_own_jobs_and_staff_all(api, alice, bob, admin_user, sync_jobs):
    mine = services.submit("noop", {}, actor=alice)
    services.submit("noop", {}, actor=bob)
    response = api(alice).get("/api/v1/jobs/")
    assert response.status_code == 200
    assert [row["id"] for row in response.json()["results"]] == [mine.pk]
    assert response.json()["results"][0]["submitter"] == "alice"
    assert api(admin_user).get("/api/v1/jobs/").json()["count"] == 2
    assert api(bob).get(f"/api/v1/jobs/{mine.pk}/").status_code == 404
    assert api().get("/api/v1/jobs/").status_code == 401


def test_list_filters_and_hides_archived(api, admin_user, sync_jobs):
    services.submit("noop", {}, actor=admin_user)
    failed = services.submit("test.fail", {}, actor=admin_user)
    sync_jobs.drain()
    client = api(admin_user)
    assert [r["id"] for r in client.get("/api/v1/jobs/?status=error").json()["results"]] == [failed.pk]
    assert client.get("/api/v1/jobs/?status=error&status=success").json()["count"] == 2
    assert client.get("/api/v1/jobs/?opcode=noop").json()["count"] == 1
    Job.objects.filter(pk=failed.pk).update(archived=True)
    assert client.get("/api/v1/jobs/").json()["count"] == 1
    assert client.get("/api/v1/jobs/?archived=true").json()["count"] == 1
    assert client.get("/api/v1/jobs/?status=bogus").status_code == 400


def test_list_query_budget(api, admin_user, sync_jobs, django_assert_max_num_queries):
    first = services.submit("noop", {}, actor=admin_user)
    for _ in range(20):
        services.submit("noop", {}, actor=admin_user, depends=[first.pk])
    client = api(admin_user)
    with django_assert_max_num_queries(10):
        response = client.get("/api/v1/jobs/")
    assert response.json()["count"] == 21


def test_submit_answers_202_with_the_job_url(api, alice, sync_jobs):
    alice.is_staff = True  # test opcodes are staff-only
    alice.save()
    response = api(alice).post(
        "/api/v1/jobs/",
        {"opcode": "test.sleep", "params": {"steps": 2}, "reason": "rate-limit:2:demo", "priority": -3},
        format="json",
    )
    assert response.status_code == 202, response.json()
    body = response.json()
    assert response["Location"] == body["url"] == f"http://testserver/api/v1/jobs/{body['id']}/"
    assert body["status"] == "queued" and body["submitter"] == "alice" and body["priority"] == -3
    assert body["buckets"] == [{"reason": "rate-limit:2:demo", "size": 2}]
    assert body["reason"][0][:2] == ["api:alice", "rate-limit:2:demo"]
    assert body["log_url"].endswith(f"/api/v1/jobs/{body['id']}/log/")


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"opcode": "nope"}, "opcode"),
        ({"opcode": "test.sleep", "params": {"steps": 0}}, "params.steps"),
        ({"opcode": "test.sleep", "params": {"colour": 1}}, "params.colour"),
        ({"opcode": "test.sleep", "params": []}, "params"),
        ({"opcode": "noop", "reason": "rate-limit:seven:x"}, "reason"),
        ({"opcode": "noop", "depends": [12345]}, "depends"),
        ({"opcode": "noop", "priority": 99}, "priority"),
        ({"opcode": "noop", "priority": 5}, "priority"),  # only staff may raise it
    ],
)
def test_submit_refuses_bad_input_with_field_errors(api, alice, admin_user, payload, field, sync_jobs):
    submitter = admin_user if payload["opcode"] == "test.sleep" else alice  # test opcodes are staff-only
    response = api(submitter).post("/api/v1/jobs/", payload, format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json()["error"]["fields"]
    assert Job.objects.count() == 0


def test_staff_only_opcodes_and_read_only_tokens(api, alice, admin_user, sync_jobs):
    response = api(alice).post("/api/v1/jobs/", {"opcode": "cluster.verify"}, format="json")
    assert response.status_code == 403
    assert "your role may not" in response.json()["error"]["message"]
    assert api(admin_user).post("/api/v1/jobs/", {"opcode": "cluster.verify"}, format="json").status_code == 202
    assert api(alice, write=False).post("/api/v1/jobs/", {"opcode": "noop"}, format="json").status_code == 403


def test_users_cannot_depend_on_jobs_they_cannot_see(api, alice, bob, sync_jobs):
    theirs = services.submit("noop", {}, actor=bob)
    response = api(alice).post("/api/v1/jobs/", {"opcode": "noop", "depends": [theirs.pk]}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["depends"] == [f"job {theirs.pk} does not exist"]


def test_cancel_and_retry(api, alice, bob, sync_jobs):
    job = services.submit("noop", {}, actor=alice)
    assert api(bob).post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 404
    response = api(alice).post(f"/api/v1/jobs/{job.pk}/cancel/", {"reason": "oops"}, format="json")
    assert response.status_code == 202
    assert response.json()["status"] == "canceled"
    assert response.json()["error"] == {"kind": "canceled", "message": "canceled by alice: oops"}
    again = api(alice).post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert again.status_code == 409  # a service Conflict, answered by core.api.errors
    message = f"job {job.pk} already ended (canceled)"
    assert again.json() == {"error": {"status": 409, "code": "conflict", "message": message}}
    retry = api(alice).post(f"/api/v1/jobs/{job.pk}/retry/")
    assert retry.status_code == 202
    assert retry.json()["retry_of"] == job.pk and retry["Location"] == retry.json()["url"]
    assert api(alice).post(f"/api/v1/jobs/{retry.json()['id']}/retry/").status_code == 409


def test_batch_with_names_and_cycles(api, admin_user, sync_jobs):
    client = api(admin_user)
    response = client.post(
        "/api/v1/jobs/batch/",
        {"jobs": [{"opcode": "noop", "name": "a"}, {"opcode": "noop", "depends": ["@a"]}]},
        format="json",
    )
    assert response.status_code == 202
    first, second = response.json()
    assert second["depends"] == [{"job": first["id"], "statuses": ["success"]}]
    cycle = client.post(
        "/api/v1/jobs/batch/",
        {
            "jobs": [
                {"opcode": "noop", "name": "a", "depends": ["@b"]},
                {"opcode": "noop", "name": "b", "depends": ["@a"]},
            ]
        },
        format="json",
    )
    assert cycle.status_code == 400
    assert "dependency cycle" in cycle.json()["error"]["message"]


def test_the_log_endpoint_pages_with_after(api, alice, sync_jobs):
    job = services.submit("test.sleep", {"steps": 2, "seconds": 0}, actor=alice)
    sync_jobs.drain()
    entries = api(alice).get(f"/api/v1/jobs/{job.pk}/log/").json()
    assert [e["message"] for e in entries][-1] == "success"
    later = api(alice).get(f"/api/v1/jobs/{job.pk}/log/?after={entries[1]['id']}").json()
    assert later == entries[2:]
    assert api(alice).get(f"/api/v1/jobs/{job.pk}/log/?after=x").status_code == 400


def test_queue_get_for_all_put_for_staff(api, alice, admin_user):
    assert api(alice).get("/api/v1/queue/").json()["limit"] == 20
    assert api(alice).put("/api/v1/queue/", {"limit": 3}, format="json").status_code == 403
    response = api(admin_user).put("/api/v1/queue/", {"limit": 3, "reason": "maintenance"}, format="json")
    assert response.status_code == 200 and response.json()["limit"] == 3
    assert QueueSettings.get().limit == 3
    for bad in (0, "abc", 1.5, -2):
        response = api(admin_user).patch("/api/v1/queue/", {"limit": bad}, format="json")
        assert response.status_code == 400 and "limit" in response.json()["error"]["fields"]
    assert QueueSettings.get().limit == 3


def test_opcodes_are_listed_with_their_params(api, alice):
    rows = {row["name"]: row for row in api(alice).get("/api/v1/opcodes/").json()}
    assert rows["noop"]["staff_only"] is False and rows["test.sleep"]["staff_only"] is True
    assert rows["cluster.verify"]["staff_only"] is True
    assert rows["test.sleep"]["params"]["steps"] == {"type": "integer", "required": False, "help": "", "default": 1}


def test_detail_shows_everything(api, admin_user, sync_jobs):
    parent = services.submit("test.expand", {"children": [{"opcode": "noop"}]}, actor=admin_user)
    sync_jobs.drain()
    body = api(admin_user).get(f"/api/v1/jobs/{parent.pk}/").json()
    child = refresh(parent).children.get()
    assert body["children"] == [child.pk]
    assert body["status"] == "success" and body["error"] is None
    assert body["result"]["children"]["success"] == [child.pk]
    assert api(admin_user).get(f"/api/v1/jobs/{child.pk}/").json()["parent"] == parent.pk


@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/jobs/99999999999999999999/",
        "/api/v1/jobs/99999999999999999999/log/",
        "/api/v1/jobs/?parent=99999999999999999999",
        "/api/v1/jobs/?received_after=0001-01-01T00:00:00%2B05:00",
        "/api/v1/jobs/?received_after=2024-01-01T00:00:00%2B22:56",
        "/api/v1/jobs/1/log/?after=99999999999999999999999",
    ],
)
def test_out_of_range_reads_are_refused_not_crashed(api, admin_user, url):
    assert api(admin_user).get(url).status_code in (200, 400, 404)


@pytest.mark.parametrize(
    "body",
    [
        {"opcode": "noop", "depends": [99999999999999999999]},
        {"opcode": "noop", "depends": [[1.5, []]]},
        {"opcode": "noop", "priority": 99999999999999999999},
        {"opcode": "test.sleep", "params": {"steps": 99999999999999999999}},
        {"opcode": "noop", "depends": [[]]},
        {"opcode": "noop", "depends": [[1]]},
        {"opcode": "noop", "depends": [[1, [], 3]]},
    ],
)
def test_out_of_range_submissions_are_refused(api, admin_user, body, sync_jobs):
    assert api(admin_user).post("/api/v1/jobs/", body, format="json").status_code == 400


def test_a_user_cannot_cancel_a_job_the_system_runs_for_them(api, alice, admin_user, client, sync_jobs):
    """reservation.settle runs for the reservation's user; canceling it stranded the reservation."""
    job = services.submit("test.fail", {}, actor="system", submitter=alice)

    response = api(alice).post(f"/api/v1/jobs/{job.pk}/cancel/")

    assert response.status_code == 409
    assert "only staff may cancel it" in response.json()["error"]["message"]
    client.force_login(alice)
    client.post(f"/provisioning/jobs/{job.pk}/cancel/")
    assert refresh(job).status == Job.Status.QUEUED
    assert api(admin_user).post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 202


def test_tracebacks_in_a_job_log_are_for_staff_only(api, alice, admin_user, client, sync_jobs):
    job = services.submit("test.fail", {}, actor="system", submitter=alice)
    sync_jobs.drain()
    from core.models import Event

    theirs = api(alice).get(f"/api/v1/jobs/{job.pk}/log/").json()
    staff = api(admin_user).get(f"/api/v1/jobs/{job.pk}/log/").json()
    assert any("Traceback" in entry["message"] for entry in staff)
    assert theirs and not any("Traceback" in entry["message"] for entry in theirs)
    assert "Traceback" not in str(api(alice).get(f"/api/v1/jobs/{job.pk}/").json())
    client.force_login(alice)
    assert "Traceback" not in client.get(f"/provisioning/jobs/{job.pk}/").content.decode()
    streamed = {e.topic for e in Event.objects.filter(kind="job.log") if "Traceback" in str(e.data)}
    assert streamed == {"admin"}


def test_the_queue_shows_users_only_their_own_jobs_buckets(api, alice, admin_user, client, sync_jobs):
    from jobs import dispatcher

    services.submit("test.sleep", {}, actor=admin_user, reason="rate-limit:2:evacuating rack 4 for the audit")
    dispatcher.claim_next()

    theirs = api(alice).get("/api/v1/queue/").json()
    assert theirs["running"] == 1 and theirs["buckets"] == []
    assert [b["label"] for b in api(admin_user).get("/api/v1/queue/").json()["buckets"]] == [
        "evacuating rack 4 for the audit"
    ]
    client.force_login(alice)
    assert "evacuating rack 4" not in client.get("/provisioning/jobs/").content.decode()
