"""The jobs pages: list, detail with log, submit, cancel, retry, queue."""

import pytest

from jobs import services
from jobs.models import Job, QueueSettings
from tests.jobs.helpers import refresh

pytestmark = pytest.mark.django_db


def test_the_list_shows_own_jobs_and_subscribes_to_the_users_topic(client, alice, bob, sync_jobs):
    mine = services.submit("noop", {}, actor=alice)
    services.submit("test.sleep", {}, actor=bob)
    client.force_login(alice)
    page = client.get("/provisioning/jobs/").content.decode()
    assert f'id="job-{mine.pk}"' in page
    assert "test.sleep" not in page.split("<tbody>")[1].split("</tbody>")[0]
    assert f'data-topics="user.{alice.pk}"' in page
    assert "queue-update" not in page and 'name="limit"' not in page  # the limit form is for staff


def test_staff_see_all_and_the_queue_form(client, admin_user, alice, sync_jobs):
    services.submit("noop", {}, actor=alice)
    client.force_login(admin_user)
    page = client.get("/provisioning/jobs/?status=queued").content.decode()
    assert 'data-topics="admin"' in page and 'name="limit"' in page and "noop" in page


def test_the_detail_page_has_the_log_trail_and_live_topic(client, alice, bob, sync_jobs):
    job = services.submit("test.sleep", {"seconds": 0}, actor=alice, reason="because")
    sync_jobs.drain()
    client.force_login(alice)
    page = client.get(f"/provisioning/jobs/{job.pk}/").content.decode()
    assert "step 1/1 &#x27;sleep 1&#x27; done" in page
    assert "because" in page and f'data-id="{job.pk}"' in page and "js/pages/job_detail.js" in page
    assert "Retry as a new job" not in page  # it succeeded
    client.force_login(bob)
    assert client.get(f"/provisioning/jobs/{job.pk}/").status_code == 404


def test_submit_cancel_retry_through_the_pages(client, alice, sync_jobs):
    client.force_login(alice)
    response = client.post(
        "/provisioning/jobs/submit/",
        {"opcode": "noop", "params": "{}", "reason": "demo", "priority": "0"},
    )
    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/provisioning/jobs/{job.pk}/"
    client.post(f"/provisioning/jobs/{job.pk}/cancel/", {"reason": "changed my mind"})
    assert refresh(job).status == "canceled"
    response = client.post(f"/provisioning/jobs/{job.pk}/retry/")
    new = Job.objects.latest("id")
    assert new.retry_of_id == job.pk and response["Location"] == f"/provisioning/jobs/{new.pk}/"


@pytest.mark.parametrize(
    "data, message",
    [
        ({"opcode": "cluster.verify", "params": "{}", "priority": "0"}, "opcode"),
        ({"opcode": "test.sleep", "params": "{nope", "priority": "0"}, "not valid JSON"),
        ({"opcode": "test.sleep", "params": '{"steps": -1}', "priority": "0"}, "steps"),
        ({"opcode": "noop", "params": "{}", "priority": "3"}, "only operators"),
    ],
)
def test_bad_submissions_show_errors_and_queue_nothing(client, alice, data, message, sync_jobs):
    client.force_login(alice)
    response = client.post("/provisioning/jobs/submit/", data, follow=True)
    assert message in response.content.decode()
    assert Job.objects.count() == 0


def test_only_staff_tune_the_queue(client, alice, admin_user):
    client.force_login(alice)
    assert client.post("/provisioning/queue/", {"limit": 2, "lease_seconds": 30, "max_attempts": 3}).status_code == 403
    client.force_login(admin_user)
    client.post("/provisioning/queue/", {"limit": 2, "lease_seconds": 30, "max_attempts": 3})
    assert QueueSettings.get().limit == 2
    response = client.post("/provisioning/queue/", {"limit": 0, "lease_seconds": 30, "max_attempts": 3}, follow=True)
    assert "limit" in response.content.decode() and QueueSettings.get().limit == 2


def test_pages_need_a_login(client):
    assert client.get("/provisioning/jobs/").status_code == 302
    assert client.post("/provisioning/jobs/submit/").status_code == 302


def test_admin_pages_render(client, admin_user, sync_jobs):
    job = services.submit("noop", {}, actor=admin_user)
    client.force_login(admin_user)
    assert client.get("/admin/jobs/job/").status_code == 200
    assert client.get(f"/admin/jobs/job/{job.pk}/change/").status_code == 200
    assert client.get("/admin/jobs/queuesettings/").status_code == 200
    response = client.post("/admin/jobs/queuesettings/1/change/", {"limit": 7, "lease_seconds": 30, "max_attempts": 3})
    assert response.status_code == 302 and QueueSettings.get().limit == 7
    response = client.post("/admin/jobs/job/", {"action": "cancel_jobs", "_selected_action": [job.pk]})
    assert response.status_code == 302 and refresh(job).status == "canceled"


def test_unknown_and_out_of_range_ids_are_404(client, alice):
    client.force_login(alice)
    assert client.get("/provisioning/jobs/424242/").status_code == 404
    assert client.get("/provisioning/jobs/99999999999999999999/").status_code == 404
    assert client.post("/provisioning/jobs/99999999999999999999/cancel/").status_code == 404


def test_the_list_pages_newest_first_and_keeps_the_status_filter(client, alice, sync_jobs):
    services.submit_batch([{"opcode": "noop"} for _ in range(51)], actor=alice, submitter=alice)
    client.force_login(alice)
    first = client.get("/provisioning/jobs/?status=queued").content.decode()
    assert "page 1 of 2" in first and 'href="?status=queued&amp;page=2">older →' in first
    second = client.get("/provisioning/jobs/?status=queued&page=2").content.decode()
    assert 'href="?status=queued&amp;page=1">← newer' in second and "older →" not in second
