"""A run submitted while its request's PostgreSQL session is ended, at any one of its
statements, is made once, with its job. PostgreSQL only (marker ``postgres``)."""

import pytest

from jobs.models import Job
from runs.models import Run
from tests.lost_session import at_every_statement

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_a_run_submitted_while_the_session_is_lost_is_made_once(sim_host, image, alice, client, profile, sync_jobs):
    profile(output="ok\n")
    client.force_login(alice)

    def submit_once(fault):
        before = set(Run.objects.values_list("pk", flat=True))
        fault.armed = True
        answer = client.post(
            "/api/v1/runs/",
            {"image": image.pk, "argv": ["make", "test"], "time_limit": 60},
            content_type="application/json",
        )
        fault.armed = False
        assert answer.status_code == 202, (fault.n, answer.content)
        made = list(Run.objects.exclude(pk__in=before).values_list("pk", flat=True))
        assert made == [answer.json()["run"]["id"]], fault.n
        assert Job.objects.filter(pk=answer.json()["job"]).exists(), fault.n
        sync_jobs.drain()
        assert Run.objects.get(pk=made[0]).state == "success", fault.n

    assert at_every_statement(submit_once) > 5
