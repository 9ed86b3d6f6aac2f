"""A user's runs on their home page: only their own, active or ended today, with the next action."""

from datetime import timedelta

import pytest
from django.utils import timezone

from runs import home
from runs.models import Run

pytestmark = pytest.mark.django_db


def run_of(user, image, state, ended_ago=None, error="", exit_status=None):
    ended = timezone.now() - ended_ago if ended_ago is not None else None
    return Run.objects.create(
        owner=user,
        image=image,
        vcpus=1,
        memory_mib=256,
        disk_gib=1,
        argv=["make", "test"],
        time_limit=60,
        state=state,
        ended=ended,
        error=error,
        exit_status=exit_status,
        hold_until=timezone.now(),
    )


def test_home_lists_the_users_own_runs_with_the_next_action(client, image, alice, bob):
    running = run_of(alice, image, "running")
    passed = run_of(alice, image, "success", ended_ago=timedelta(hours=1), exit_status=0)
    failed = run_of(alice, image, "error", ended_ago=timedelta(hours=2), error="exited with status 3\nmore")
    old = run_of(alice, image, "success", ended_ago=timedelta(days=2), exit_status=0)
    other = run_of(bob, image, "running")

    client.force_login(alice)
    page = client.get("/").content.decode()
    for run, verb in [(running, "watch"), (passed, "output"), (failed, "why")]:
        assert f'id="home-run-{run.pk}" data-action="{verb}"' in page
    assert "See why: exited with status 3" in page and "more" not in page.split("See why:")[1][:40]
    assert f"home-run-{old.pk}" not in page and f"home-run-{other.pk}" not in page
    assert client.get("/home/panel/").content.decode().count('id="home-run-') == 3
    assert [run.pk for run, _ in home.runs_of(bob)] == [other.pk]


def test_no_runs_no_section(client, alice):
    client.force_login(alice)
    assert 'id="home-runs"' not in client.get("/home/panel/").content.decode()
