"""The runs API: submit (JSON and multipart), list, detail, log paged with after=, artifacts,
cancel; another user's run is a 404 everywhere."""

import base64

import pytest

from runs.models import Run

URL = "/api/v1/runs/"
pytestmark = pytest.mark.django_db


def test_a_run_submitted_as_json_is_accepted_and_its_log_paged(api, sim_host, image, alice, profile, sync_jobs):
    profile(output="line\n", repeat=3)
    client = api(alice)
    response = client.post(
        URL,
        {"platform": "debian-12", "argv": ["make", "test"], "time_limit": 60, "env": {"TOKEN": "s3cret"}},
        format="json",
    )
    assert response.status_code == 202, response.content
    body = response.json()
    rid = body["run"]["id"]
    assert body["run"]["state"] == "queued" and body["job"] and body["job_url"].endswith(f"/jobs/{body['job']}/")
    assert body["run"]["env_names"] == ["TOKEN"] and "s3cret" not in response.content.decode()
    sync_jobs.drain()
    detail = client.get(f"{URL}{rid}/").json()
    assert detail["state"] == "success" and detail["exit_status"] == 0
    page = client.get(f"{URL}{rid}/log/", {"limit": 1}).json()
    assert page["ended"] and page["state"] == "success" and len(page["chunks"]) == 1
    text = page["chunks"][0]["text"]
    rest = client.get(f"{URL}{rid}/log/", {"after": page["next"]}).json()
    assert text + "".join(c["text"] for c in rest["chunks"]) == "line\n" * 3
    assert client.get(f"{URL}{rid}/log/", {"after": rest["next"]}).json()["chunks"] == []
    assert [r["id"] for r in client.get(URL).json()["results"]] == [rid]


def test_multipart_brings_input_files_and_artifacts_download(api, sim_host, image, alice, profile, sync_jobs):
    profile(files={"out/r.xml": "<r/>"}, output_hex="ff0a")
    client = api(alice)
    from django.core.files.uploadedfile import SimpleUploadedFile

    form = {
        "platform": "debian-12",
        "argv": '["./check"]',
        "artifacts": '["out/*.xml"]',
        "input:data/x.txt": SimpleUploadedFile("x.txt", b"abc"),
    }
    response = client.post(URL, form, format="multipart")
    assert response.status_code == 202, response.content
    rid = response.json()["run"]["id"]
    sync_jobs.drain()
    files = client.get(f"{URL}{rid}/artifacts/").json()
    assert {(f["kind"], f["path"], f["size"]) for f in files} == {
        ("input", "data/x.txt", 3),
        ("artifact", "out/r.xml", 4),
    }
    artifact = next(f for f in files if f["kind"] == "artifact")
    download = client.get(artifact["url"])
    assert download.status_code == 200 and b"".join(download.streaming_content) == b"<r/>"
    chunk = client.get(f"{URL}{rid}/log/").json()["chunks"][0]
    assert chunk["text"] == "\ufffd\n" and base64.b64decode(chunk["data_b64"]) == b"\xff\n"


def test_bad_input_is_a_400_naming_the_field_and_creates_nothing(api, sim_host, image, alice):
    client = api(alice)
    for body, field in (
        ({"platform": "plan9", "argv": ["x"]}, "platform"),
        ({"platform": "debian-12", "argv": []}, "command"),
        ({"platform": "debian-12", "argv": ["x"], "artifacts": ["../x"]}, "artifacts"),
        ({"platform": "debian-12", "argv": ["x"], "time_limit": 1}, "time_limit"),
        ({"platform": "debian-12", "argv": ["x"], "colour": "red"}, "colour"),
    ):
        response = client.post(URL, body, format="json")
        assert response.status_code == 400 and field in response.json()["error"]["fields"], (body, response.content)
    from django.core.files.uploadedfile import SimpleUploadedFile

    response = client.post(
        URL,
        {"platform": "debian-12", "argv": '["x"]', "input:../etc/x": SimpleUploadedFile("x", b"1")},
        format="multipart",
    )
    assert response.status_code == 400 and "inputs" in response.json()["error"]["fields"]
    assert not Run.objects.exists()


def test_another_users_run_is_a_404_everywhere_and_staff_see_it(
    api, sim_host, image, alice, bob, admin_user, sync_jobs
):
    rid = api(alice).post(URL, {"platform": "debian-12", "argv": ["x"]}, format="json").json()["run"]["id"]
    sync_jobs.drain()
    stranger = api(bob)
    for path in ("", "log/", "artifacts/", "artifacts/1/"):
        assert stranger.get(f"{URL}{rid}/{path}").status_code == 404, path
    assert stranger.post(f"{URL}{rid}/cancel/").status_code == 404
    assert stranger.get(URL).json()["results"] == []
    assert api(admin_user).get(f"{URL}{rid}/").status_code == 200
    assert api(None).get(URL).status_code in (401, 403)


def test_cancel_through_the_api(api, sim_host, image, alice):
    client = api(alice)
    rid = client.post(URL, {"platform": "debian-12", "argv": ["x"]}, format="json").json()["run"]["id"]
    response = client.post(f"{URL}{rid}/cancel/")
    assert response.status_code == 200 and response.json()["state"] == "canceled"
    assert client.post(f"{URL}{rid}/cancel/").status_code == 409
