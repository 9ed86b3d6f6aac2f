"""The run pages: the owner's list and a run's page with its log; a stranger gets a 404."""

import pytest

from core import topics
from runs import services
from runs.models import Run

pytestmark = pytest.mark.django_db


def test_the_run_page_shows_the_log_and_files_to_its_owner(client, sim_host, image, alice, profile, sync_jobs):
    profile(output="caf", output_hex="e90a", files={"out/a.xml": "<a/>"})
    run = services.submit(actor=alice, owner=alice, platform="debian-12", argv=["make"], artifacts=["out/*.xml"])
    sync_jobs.drain()
    client.force_login(alice)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "caf\ufffd" in page and "out/a.xml" in page and "exited with status 0" in page
    assert "js/pages/run_detail.js" in page and "<script>" not in page
    assert f"/runs/{run.pk}/" in client.get("/runs/").content.decode()


def test_a_stranger_gets_a_404_and_cannot_cancel(client, sim_host, image, alice, bob):
    run = services.submit(actor=alice, owner=alice, platform="debian-12", argv=["make"])
    client.force_login(bob)
    assert client.get(f"/runs/{run.pk}/").status_code == 404
    assert client.post(f"/runs/{run.pk}/cancel/").status_code == 404
    assert Run.objects.get(pk=run.pk).state == "queued"
    assert not topics.may_subscribe(bob, f"run.{run.pk}") and topics.may_subscribe(alice, f"run.{run.pk}")


def test_the_owner_cancels_from_the_page(client, sim_host, image, alice):
    run = services.submit(actor=alice, owner=alice, platform="debian-12", argv=["make"])
    client.force_login(alice)
    assert client.post(f"/runs/{run.pk}/cancel/").status_code == 302
    assert Run.objects.get(pk=run.pk).state == "canceled"


def test_a_run_started_from_the_page_goes_to_its_page(client, sim_host, image, alice):
    client.force_login(alice)
    page = client.get("/runs/").content.decode()
    assert 'value="debian-12/x86_64"' in page
    response = client.post(
        "/runs/",
        {"platform": "debian-12/x86_64", "command": "make 'unit tests'", "time_limit": 5, "artifacts": "out/*.xml"},
    )
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.pk}/"
    assert run.argv == ["make", "unit tests"] and run.time_limit == 300 and run.artifacts == ["out/*.xml"]


def test_the_page_form_shows_the_services_refusal(client, sim_host, image, alice):
    client.force_login(alice)
    response = client.post(
        "/runs/", {"platform": "debian-12/x86_64", "command": "make", "time_limit": 5, "artifacts": "../secret"}
    )
    assert response.status_code == 200 and "cannot leave the work directory" in response.content.decode()
    assert not Run.objects.exists()


def test_the_demo_gives_debian_12_runs_a_sample_result(db):
    from io import StringIO

    from drivers.sim.models import SimExecProfile
    from runs import demo

    demo.runs(StringIO())
    demo.runs(StringIO())
    assert SimExecProfile.objects.get(image="debian-12").files == demo.SAMPLE["files"]
