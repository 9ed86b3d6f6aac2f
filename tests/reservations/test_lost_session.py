"""A reservation request whose PostgreSQL session is ended at any one of its statements still
does its work exactly once: the lost statement is sent again, or the lost transaction's request
runs again, and nothing of it is left half done (a reservation ending with no teardown queued,
a reservation without its build job). What the topology test's "terminate a web machine's
database sessions" fault does to a request at a random statement, here at every one in turn.

PostgreSQL only (marker ``postgres``: the SQLite leg deselects it)."""

from datetime import timedelta

import pytest
from django.db.models import Q

from accounts.models import ApiToken
from jobs.models import Job
from reservations import services
from reservations.models import Reservation
from tests.lost_session import at_every_statement

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
    from capacity.models import Allocation

    client.force_login(alice)
    reservation = services.reserve(alice, image, actor=alice, duration=H)
    sync_jobs.drain()

    def extend_once(fault):
        row = Reservation.objects.get(pk=reservation.pk)
        fault.armed = True
        answer = client.post(
            f"{URL}{row.pk}/extend/", {"end": (row.end + MINUTE).isoformat()}, content_type="application/json"
        )
        fault.armed = False
        assert answer.status_code == 200, (fault.n, answer.content)
        after = Reservation.objects.get(pk=reservation.pk)
        assert after.end == row.end + MINUTE, fault.n
        claims = Allocation.objects.filter(released__isnull=True, owner=alice)
        assert [(c.pk, c.end) for c in claims] == [(after.allocation_id, after.end)], fault.n

    assert at_every_statement(extend_once) > 5


def test_a_cancel_while_the_session_is_lost_cancels_and_gives_the_claim_back(sim_host, image, alice, client):
    from django.utils import timezone

    from capacity.models import Allocation

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


def drain_struck(sync_jobs, fault):
    """Run the queued jobs as workers would, ``fault`` armed for their statements only. A claim
    that lost its session fails its django-q2 task, not the job: the next task goes on."""
    fault.armed = True
    for _ in range(5):
        try:
            sync_jobs.drain()
            break
        except Exception as exc:  # noqa: BLE001 (what a django-q2 task's failure is to the worker)
            assert "terminating connection" in str(exc) or "closed" in str(exc), (fault.n, exc)
    fault.armed = False


def test_a_build_whose_session_is_lost_at_any_statement_still_makes_one_vm_and_ends_in_success(
    sim_host, image, alice, sync_jobs
):
    """The worker's side of the same fault: a job's transaction that died with its session
    rolled back whole, and its steps are safe to repeat, so the job goes back to the queue and
    runs again (as after a lost worker, without waiting for its lease) instead of failing."""
    from capacity.models import Allocation
    from drivers.sim.models import SimVM
    from jobs.models import JobLog
    from provisioning.models import VM

    struck = []  # per fault: did it strike inside the build job (not its claim or its end)?

    def build_once(fault):
        reservation = services.reserve(alice, image, actor=alice, duration=H)
        drain_struck(sync_jobs, fault)
        row = Reservation.objects.get(pk=reservation.pk)
        build = Job.objects.filter(opcode="vm.create", params__vm=row.vm_id).get()
        log = [fault.n, *JobLog.objects.filter(job=build).values_list("message", flat=True)]
        assert (row.status, build.status) == ("ready", "success"), log
        vm = VM.objects.get(pk=row.vm_id)
        assert SimVM.objects.filter(key=vm.key).count() == 1, log
        assert vm.allocation_id == row.allocation_id, log  # the reservation's own claim, adopted
        struck.append(any("database session was lost" in line for line in log[1:]))
        services.end(row, "next round", actor=alice)
        sync_jobs.drain()
        assert not Allocation.objects.filter(released__isnull=True, owner=alice).exists(), fault.n
        assert not SimVM.objects.filter(key=vm.key).exists(), fault.n

    assert at_every_statement(build_once) > 20
    assert sum(struck) > 5, struck  # the job went back to the queue that often, and ended in success
    assert not Job.objects.filter(status="error").exists()


def test_a_build_that_loses_its_session_on_its_last_attempt_fails_saying_so_and_leaves_nothing_behind(
    sim_host, make_host, image, alice, sync_jobs
):
    """With no attempt left, the job fails with the database's error and no cleanup of its own
    (it did not know it was the last): the reservation's settle undoes what it made — a VM not
    yet defined fails at once, one that may be on its host is destroyed — and builds it again
    on the other host. At every statement: nothing leaked, nothing left on a host."""
    from capacity.models import Allocation
    from drivers.sim.models import SimVM
    from jobs import services as jobs
    from provisioning.models import VM

    make_host("sim-2", driver="sim", cpus=8, memory_mib=8192, disk_gib=200)  # for the retry on another host
    jobs.set_queue_settings(actor="test", max_attempts=1)
    given_up = []  # per fault that failed a build: the state its settle left that VM in

    def build_once(fault):
        before = Job.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
        reservation = services.reserve(alice, image, actor=alice, duration=H)
        drain_struck(sync_jobs, fault)
        sync_jobs.drain()  # the destroy its settle queued
        failed = Job.objects.filter(pk__gt=before, opcode="vm.create", status="error").first()
        row = Reservation.objects.get(pk=reservation.pk)
        assert row.status == "ready", (fault.n, row.error)
        if failed is not None:
            assert "terminating connection" in failed.error_message, fault.n
            assert "(attempt 1 of 1)" in failed.error_message, fault.n
            first = VM.objects.get(pk=failed.params["vm"])
            assert row.vm_id != first.pk, fault.n
            given_up.append(first.state)
        live = VM.objects.filter(state__in=VM.LIVE)
        assert [vm.pk for vm in live] == [row.vm_id], fault.n
        assert sorted(SimVM.objects.values_list("key", flat=True)) == [live[0].key], fault.n
        claims = Allocation.objects.filter(released__isnull=True).values_list("pk", flat=True)
        assert list(claims) == [row.allocation_id], fault.n
        services.end(row, "next round", actor=alice)
        sync_jobs.drain()
        assert not Allocation.objects.filter(released__isnull=True).exists(), fault.n

    assert at_every_statement(build_once) > 20
    assert "failed" in given_up and "destroyed" in given_up, given_up  # both ways were struck
