"""A reservation request whose PostgreSQL session is ended at any one of its statements still
does its work exactly once: the lost statement is sent again, or the lost transaction's request
runs again, and nothing of it is left half done (a reservation ending with no teardown queued,
a reservation without its build job). What the topology test's "terminate a web machine's
database sessions" fault does to a request at a random statement, here at every one in turn.

PostgreSQL only (marker ``postgres``: the SQLite leg deselects it)."""

from datetime import timedelta

import pytest
from django.db.models import Q

from provisioning.jobs.models import Job
from reservations import services
from reservations.models import Reservation
from tests.lost_session import at_every_statement
from vclmgr.models import ApiToken

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
URL = "/api/v1/reservations/"
H = timedelta(hours=1)
MINUTE = timedelta(minutes=1)


def test_ending_a_ready_reservation_queues_its_teardown_once_whatever_statement_loses_the_session(
    sim_host, image, alice, client, sync_jobs
):
    client.force_login(alice)

    def end_once(fault):
        reservation = services.reserve(alice, image, actor=alice, duration=H)
        sync_jobs.drain()
        fault.armed = True  # the request's statements only
        answer = client.post(f"{URL}{reservation.pk}/end/", content_type="application/json")
        fault.armed = False
        assert answer.status_code == 202, (fault.n, answer.content)
        row = Reservation.objects.get(pk=reservation.pk)
        assert row.vm_id is not None
        queued = Job.objects.filter(
            Q(params__vm=row.vm_id) | Q(params__reservation=row.pk), opcode__in=("vm.destroy", "reservation.finish")
        ).values_list("opcode", flat=True)
        assert row.status == "ending", fault.n
        assert sorted(queued) == ["reservation.finish", "vm.destroy"], (fault.n, list(queued))
        sync_jobs.drain()
        assert Reservation.objects.get(pk=reservation.pk).status == "ended", fault.n

    assert at_every_statement(end_once) > 5


@pytest.mark.parametrize("auth", ["session", "token"])
def test_a_reservation_made_while_the_session_is_lost_is_made_once(
    sim_host, image, alice, client, api, sync_jobs, auth
):
    if auth == "session":
        client.force_login(alice)
    else:
        client = api(alice)

    def create_once(fault):
        before = set(Reservation.objects.values_list("pk", flat=True))
        ApiToken.objects.update(last_used=None)  # a token's first use in a while writes its last use
        fault.armed = True
        answer = client.post(URL, {"image": image.pk, "duration_minutes": 60}, content_type="application/json")
        fault.armed = False
        assert answer.status_code == 202, (fault.n, answer.content)
        made = Reservation.objects.exclude(pk__in=before)
        assert [r.pk for r in made] == [answer.json()["reservation"]["id"]], fault.n
        assert Job.objects.filter(pk=answer.json()["job"]).exists(), fault.n
        sync_jobs.drain()
        services.end(made.get(), "next round", actor=alice)
        sync_jobs.drain()

    assert at_every_statement(create_once) > 5


def test_an_extension_while_the_session_is_lost_moves_the_end_and_its_claim_together(
    sim_host, image, alice, client, sync_jobs
):
    from provisioning.capacity.models import Allocation

    client.force_login(alice)
    reservation = services.reserve(alice, image, actor=alice, duration=H)
    sync_jobs.drain()

    def extend_once(fault):
        row = Reservation.objects.get(pk=reservation.pk)
        fault.armed = True
        answer = client.post(f"{URL}{row.pk}/extend/", {"end": (row.end + MINUTE).isoformat()},
                             content_type="application/json")  # fmt: skip
        fault.armed = False
        assert answer.status_code == 200, (fault.n, answer.content)
        after = Reservation.objects.get(pk=reservation.pk)
        assert after.end == row.end + MINUTE, fault.n
        claims = Allocation.objects.filter(released__isnull=True, owner=alice)
        assert [(c.pk, c.end) for c in claims] == [(after.allocation_id, after.end)], fault.n

    assert at_every_statement(extend_once) > 5


def test_a_cancel_while_the_session_is_lost_cancels_and_gives_the_claim_back(sim_host, image, alice, client):
    from django.utils import timezone

    from provisioning.capacity.models import Allocation

    client.force_login(alice)

    def cancel_once(fault):
        start = timezone.now() + 5 * H
        reservation = services.reserve(alice, image, actor=alice, start=start, duration=H)
        fault.armed = True
        answer = client.post(f"{URL}{reservation.pk}/cancel/", content_type="application/json")
        fault.armed = False
        assert answer.status_code == 200, (fault.n, answer.content)
        assert Reservation.objects.get(pk=reservation.pk).status == "canceled", fault.n
        assert not Allocation.objects.filter(released__isnull=True, owner=alice).exists(), fault.n

    assert at_every_statement(cancel_once) > 3
