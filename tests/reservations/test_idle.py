"""Idle reclamation on the simulator: the state machine, policies per image and per group, the
periodic round, the warning's mail, and what users and staff see."""

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core import events
from core.models import Event
from drivers.base import GuestSession
from drivers.sim import services as sim
from jobs.models import Job
from notifications.models import Notification
from provisioning.models import VM
from reservations import idle, reclaim, services, tasks, usage
from reservations.models import Refusal, Reservation
from tests.images import sim_image

H, M = timedelta(hours=1), timedelta(minutes=1)
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
POLICY = idle.Policy(no_show_minutes=15, idle_minutes=60, warn_minutes=10, source="test")


def fresh(reservation):
    return Reservation.objects.get(pk=reservation.pk)


def ready(user, image, sync_jobs, hours=4):
    reservation = services.reserve(user, image, actor=user, duration=hours * H)
    sync_jobs.drain()
    reservation = fresh(reservation)
    assert reservation.status == "ready", reservation.error
    return reservation


def login(reservation, *who, idle_seconds=None):
    sim.set_sessions(reservation.vm.key, [{"user": w, "idle_seconds": idle_seconds} for w in who], actor="test")


def at(reservation, minutes):
    return fresh(reservation).idle_since + minutes * M if minutes is not None else None


# --- the pure state machine ------------------------------------------------------------------


def test_a_reservation_nobody_connects_to_is_ended_as_a_no_show_after_its_limit():
    clock = idle.Clock(idle_since=T0)
    early = idle.decide(POLICY, clock, [], T0 + 14 * M, check_seconds=60)
    assert early.action == "none" and early.kind == "no_show" and early.deadline == T0 + 15 * M
    assert early.next_check == T0 + 15 * M  # asked again no later than the deadline
    assert idle.decide(POLICY, clock, [], T0 + 15 * M).action == "end"


def test_a_connected_then_idle_reservation_is_warned_then_ended():
    seen = idle.decide(POLICY, idle.Clock(T0), [GuestSession("alice")], T0 + 5 * M)
    assert seen.clock.connected_at == T0 + 5 * M and seen.clock.idle_since == T0 + 5 * M and seen.kind == "idle"
    quiet = idle.decide(POLICY, seen.clock, [], T0 + 50 * M, check_seconds=600)
    assert quiet.action == "none" and quiet.deadline == T0 + 65 * M and quiet.next_check == T0 + 55 * M
    warned = idle.decide(POLICY, quiet.clock, [], T0 + 55 * M)
    assert warned.action == "warn" and warned.clock.warned_at == T0 + 55 * M
    assert idle.decide(POLICY, warned.clock, [], T0 + 56 * M).action == "none"  # warned once
    assert idle.decide(POLICY, warned.clock, [], T0 + 65 * M).action == "end"


def test_activity_resets_the_timer_and_the_warning():
    warned = idle.Clock(idle_since=T0, connected_at=T0, warned_at=T0 + 55 * M)
    back = idle.decide(POLICY, warned, [GuestSession("alice")], T0 + 58 * M)
    assert back.action == "none" and back.clock.warned_at is None and back.deadline == T0 + 118 * M
    # A session open but without input for 50 min counts from its last input, not from now.
    stale = idle.decide(POLICY, idle.Clock(T0, T0), [GuestSession("alice", idle_seconds=3600)], T0 + 80 * M)
    assert stale.clock.idle_since == T0 + 20 * M and stale.action == "end"


def test_an_unknown_answer_never_counts_as_idleness():
    clock = idle.Clock(idle_since=T0)
    assert idle.decide(POLICY, clock, None, T0 + 90 * M).action == "none"


def test_no_policy_means_no_deadline():
    off = idle.Policy(0, 0, 10, "site")
    assert not off.active and idle.decide(off, idle.Clock(T0), [], T0 + 900 * M).deadline is None


# --- on the simulator --------------------------------------------------------------------------


def test_no_show_on_the_simulator_ends_the_reservation_with_the_reason(sim_host, image, alice, sync_jobs):
    idle.set_policy(actor="test", image=image, no_show_minutes=15, idle_minutes=60, warn_minutes=10)
    reservation = ready(alice, image, sync_jobs)
    assert reservation.idle_check_at is not None and reservation.idle_kind == "no_show"
    assert reclaim.check(reservation.pk, now=at(reservation, 10), actor="test")["action"] == "none"
    assert fresh(reservation).status == "ready"
    outcome = reclaim.check(reservation.pk, now=at(reservation, 16), actor="test")
    assert outcome["action"] == "end" and outcome["sessions"] == 0
    sync_jobs.drain()
    reservation = fresh(reservation)
    assert reservation.status == "ended" and reservation.reclaimed == "no_show"
    assert reservation.history.filter(reason__startswith="reclaimed: no-show").exists()
    assert VM.objects.get(pk=reservation.vm_id).state == "destroyed"
    assert reservation.allocation.released is not None or fresh(reservation).allocation.released is not None


def test_idle_after_a_login_is_warned_by_event_and_mail_then_ended(sim_host, image, alice, sync_jobs):
    idle.set_policy(actor="test", image=image, no_show_minutes=15, idle_minutes=60, warn_minutes=10)
    reservation = ready(alice, image, sync_jobs)
    start = fresh(reservation).idle_since
    login(reservation, "alice")
    reclaim.check(reservation.pk, now=start + 5 * M, actor="test")
    assert fresh(reservation).connected_at == start + 5 * M and fresh(reservation).idle_kind == "idle"
    login(reservation)  # logged out
    reclaim.check(reservation.pk, now=start + 30 * M, actor="test")
    assert fresh(reservation).idle_since == start + 5 * M  # no activity: the clock runs on
    assert reclaim.check(reservation.pk, now=start + 56 * M, actor="test")["action"] == "warn"
    event = Event.objects.filter(kind="reservation.idle", topic=f"reservation.{reservation.pk}").get()
    assert event.data["id"] == reservation.pk and event.data["minutes"] == 9
    mail = Notification.objects.get(kind="idle_warning")
    assert mail.user == alice and mail.data["id"] == reservation.pk
    assert reclaim.check(reservation.pk, now=start + 57 * M, actor="test")["action"] == "none"  # warned once
    assert reclaim.check(reservation.pk, now=start + 66 * M, actor="test")["action"] == "end"
    sync_jobs.drain()
    reservation = fresh(reservation)
    assert reservation.status == "ended" and reservation.reclaimed == "idle"
    assert reservation.history.filter(reason__startswith="reclaimed: idle").exists()


def test_a_login_after_the_warning_keeps_the_reservation(sim_host, image, alice, sync_jobs):
    idle.set_policy(actor="test", image=image, no_show_minutes=15, idle_minutes=60, warn_minutes=10)
    reservation = ready(alice, image, sync_jobs)
    start = fresh(reservation).idle_since
    login(reservation, "alice")
    reclaim.check(reservation.pk, now=start + 1 * M, actor="test")
    login(reservation)
    assert reclaim.check(reservation.pk, now=start + 52 * M, actor="test")["action"] == "warn"
    login(reservation, "alice")
    assert reclaim.check(reservation.pk, now=start + 60 * M, actor="test")["action"] == "none"
    assert reclaim.check(reservation.pk, now=start + 62 * M, actor="test")["action"] == "none"
    reservation = fresh(reservation)
    assert reservation.status == "ready" and reservation.idle_warned_at is None
    assert reservation.idle_deadline == start + 122 * M


def open_console(user, reservation, kind="serial"):
    """A web console session as the consumer opens one: a ticket issued, then spent."""
    from console import services as console

    vm = VM.objects.get(pk=reservation.vm_id)
    session, _ = console.redeem(console.issue(user, vm, kind), user, vm.pk, kind)
    return session


def test_a_user_on_the_web_console_only_is_no_no_show_and_idles_from_its_close(sim_host, image, alice, sync_jobs):
    from console import services as console
    from console.models import ConsoleTicket

    idle.set_policy(actor="test", image=image, no_show_minutes=15, idle_minutes=60, warn_minutes=10)
    reservation = ready(alice, image, sync_jobs)
    # Ready 16 minutes ago, nobody logged in the guest (sim: no sessions), the console open.
    Reservation.objects.filter(pk=reservation.pk).update(idle_since=timezone.now() - 16 * M)
    session = open_console(alice, reservation)
    outcome = reclaim.check(reservation.pk, actor="test")
    assert outcome["action"] == "none" and outcome["sessions"] == 1
    reservation = fresh(reservation)
    assert reservation.status == "ready" and reservation.connected_at is not None and reservation.idle_kind == "idle"

    console.closed(session.pk)
    closed = ConsoleTicket.objects.get(pk=session.pk).closed
    assert reclaim.check(reservation.pk, now=closed + 5 * M, actor="test")["action"] == "none"
    reservation = fresh(reservation)
    assert reservation.idle_since == closed and reservation.idle_deadline == closed + 60 * M  # from the close
    assert reclaim.check(reservation.pk, now=closed + 51 * M, actor="test")["action"] == "warn"
    assert reclaim.check(reservation.pk, now=closed + 60 * M, actor="test")["action"] == "end"
    sync_jobs.drain()
    assert fresh(reservation).status == "ended" and fresh(reservation).reclaimed == "idle"


def test_a_console_whose_heartbeat_stopped_counts_as_closed_at_its_last_beat(sim_host, image, alice, sync_jobs):
    from console import services as console
    from console.models import ConsoleTicket

    idle.set_policy(actor="test", image=image, no_show_minutes=15, idle_minutes=60, warn_minutes=10)
    reservation = ready(alice, image, sync_jobs)
    now = timezone.now()
    Reservation.objects.filter(pk=reservation.pk).update(idle_since=now - 80 * M)
    session = open_console(alice, reservation)
    console.still_open(session.pk)
    assert console.activity(reservation.vm.pk, alice.pk, since=now - 80 * M)["open"] == 1
    # Its web process died 61 minutes ago: no close recorded, the beats stopped then.
    ConsoleTicket.objects.filter(pk=session.pk).update(used=now - 70 * M, seen=now - 61 * M)

    outcome = reclaim.check(reservation.pk, now=now, actor="test")

    assert outcome["action"] == "end" and outcome["kind"] == "idle"
    sync_jobs.drain()
    assert fresh(reservation).status == "ended" and fresh(reservation).reclaimed == "idle"


def test_only_the_reservations_user_on_the_console_counts(sim_host, image, alice, admin_user, sync_jobs):
    idle.set_policy(actor="test", image=image, no_show_minutes=15, idle_minutes=60, warn_minutes=10)
    reservation = ready(alice, image, sync_jobs)
    open_console(admin_user, reservation, kind="vnc")  # staff looking at it: not the user showing up
    assert reclaim.check(reservation.pk, now=at(reservation, 16), actor="test")["action"] == "end"


def test_an_unreachable_guest_agent_ends_nothing(sim_host, image, alice, sync_jobs):
    idle.set_policy(actor="test", image=image, no_show_minutes=15, idle_minutes=60, warn_minutes=10)
    reservation = ready(alice, image, sync_jobs)
    sim.set_fault(sim_host.name, "guest_sessions", "unreachable", actor="test")
    outcome = reclaim.check(reservation.pk, now=at(reservation, 30), actor="test")
    assert outcome["action"] == "none" and "unreachable" in outcome["unknown"]
    assert fresh(reservation).status == "ready" and fresh(reservation).idle_check_at is not None


def test_the_group_policy_applies_to_its_members_and_the_image_policy_wins(
    sim_host, image, alice, bob, sync_jobs, django_user_model
):
    lab = Group.objects.create(name="lab")
    alice.groups.add(lab)
    idle.set_policy(actor="test", group=lab, no_show_minutes=5, idle_minutes=30, warn_minutes=5)
    mine, theirs = ready(alice, image, sync_jobs, hours=2), ready(bob, image, sync_jobs, hours=2)
    assert idle.policy_for(mine).source == "group lab" and mine.idle_check_at is not None
    assert idle.policy_for(theirs).source == "site" and theirs.idle_check_at is None  # the site's is off
    assert reclaim.check(theirs.pk, now=at(theirs, 600), actor="test")["action"] == "none"
    assert reclaim.check(mine.pk, now=at(mine, 6), actor="test")["action"] == "end"

    other = sim_image("ubuntu", size_gib=0, min_memory_mib=256, default_memory_mib=512, default_disk_gib=5)
    idle.set_policy(actor="test", image=other, no_show_minutes=0, idle_minutes=120, warn_minutes=10)
    carol = django_user_model.objects.create_user("carol", "carol@example.org", "pw")
    carol.groups.add(lab)
    res = ready(carol, other, sync_jobs, hours=3)
    assert idle.policy_for(res).source == "image ubuntu" and res.idle_kind == "idle"  # no no-show limit
    assert reclaim.check(res.pk, now=at(res, 60), actor="test")["action"] == "none"


def test_the_policy_read_along_is_the_image_s_else_the_first_group_s(sim_host, image, alice, bob, sync_jobs):
    lab, other = Group.objects.create(name="lab"), Group.objects.create(name="other")
    alice.groups.add(other, lab)  # her first group by id is "lab"
    idle.set_policy(actor="test", group=other, no_show_minutes=7, idle_minutes=40, warn_minutes=5)
    idle.set_policy(actor="test", group=lab, no_show_minutes=5, idle_minutes=30, warn_minutes=5)
    mine, theirs = ready(alice, image, sync_jobs, hours=2), ready(bob, image, sync_jobs, hours=2)

    def both(reservation):
        """The policy read along with the reservation, and read for it alone."""
        read_along = idle.with_policy(Reservation.objects.filter(pk=reservation.pk)).get()
        with CaptureQueriesContext(connection) as along_reads:
            along = idle.policy_for(read_along)
        assert len(along_reads) == 0
        return along, idle.policy_for(Reservation.objects.get(pk=reservation.pk))

    for reservation, source, minutes in ((mine, "group lab", 30), (theirs, "site", None)):
        for policy in both(reservation):
            assert policy.source == source
            if minutes:
                assert policy.idle_minutes == minutes
    idle.set_policy(actor="test", image=image, no_show_minutes=0, idle_minutes=90, warn_minutes=10)
    for reservation in (mine, theirs):  # the image's wins over the group's
        for policy in both(reservation):
            assert policy.source == f"image {image.name}" and policy.idle_minutes == 90


def test_the_periodic_round_submits_one_job_only_when_a_guest_is_due(sim_host, image, alice, sync_jobs, settings):
    assert tasks.idle_round() is None and not Job.objects.filter(opcode="reservation.idle_check").exists()
    idle.set_policy(actor="test", image=image, no_show_minutes=1, idle_minutes=60, warn_minutes=10)
    settings.IDLE_CHECK_SECONDS = 1
    reservation = ready(alice, image, sync_jobs)
    later = fresh(reservation).idle_check_at + timedelta(seconds=1)
    job = tasks.idle_round(now=later)
    assert job is not None and tasks.idle_round(now=later) is None  # one queued already
    past = timezone.now() - 2 * M
    Reservation.objects.filter(pk=reservation.pk).update(idle_since=past, idle_check_at=past)
    sync_jobs.drain()
    assert Job.objects.get(pk=job).status == "success"
    assert Job.objects.get(pk=job).result["ended"] == [reservation.pk]
    assert fresh(reservation).status == "ended" and fresh(reservation).reclaimed == "no_show"


def test_the_owner_sees_the_countdown_on_the_page_home_and_api(client, api, sim_host, image, alice, bob, sync_jobs):
    idle.set_policy(actor="test", image=image, no_show_minutes=15, idle_minutes=60, warn_minutes=10)
    reservation = ready(alice, image, sync_jobs)
    client.force_login(alice)
    page = client.get(f"/reservations/{reservation.pk}/").content.decode()
    assert f'id="idle-countdown-{reservation.pk}"' in page and "unless you connect" in page
    assert "unless you connect" in client.get("/").content.decode()
    body = api(alice).get(f"/api/v1/reservations/{reservation.pk}/").json()
    assert body["idle"]["kind"] == "no_show" and body["idle"]["minutes"] in (14, 15)
    assert api(bob).get(f"/api/v1/reservations/{reservation.pk}/").status_code == 404


def test_staff_see_reclaimed_hours_and_refusals_by_quota_and_seats(
    client, api, sim_host, image, alice, bob, admin_user, sync_jobs
):
    idle.set_policy(actor="test", image=image, no_show_minutes=15, idle_minutes=60, warn_minutes=10)
    reservation = ready(alice, image, sync_jobs, hours=4)
    # Reclaimed now, not at a clock moved ahead: the report's days are today's whatever the hour
    # (a check 16 minutes ahead at 23:50 was tomorrow's reclamation).
    Reservation.objects.filter(pk=reservation.pk).update(idle_since=timezone.now() - 16 * M)
    reclaim.check(reservation.pk, actor="test")
    sync_jobs.drain()
    reclaimed = fresh(reservation)
    today = reclaimed.reclaimed_at.date()
    report = usage.report(today, today)
    row = report["reclaimed"][0]
    given_back = (reclaimed.end - reclaimed.reclaimed_at).total_seconds() / 3600
    assert row["reason"] == "no_show" and row["count"] == 1 and 3.5 < given_back < 4
    assert row["hours"] == pytest.approx(given_back, abs=0.001)
    assert report["totals"]["reclaimed"] == 1

    from provisioning.models import QuotaRule

    QuotaRule.objects.create(name="short", max_duration_minutes=60)
    with pytest.raises(Exception, match="at most 1 h"):
        services.reserve(bob, image, actor=bob, duration=2 * H)
    lab = Group.objects.create(name="class")
    bob.groups.add(lab)
    block = services.create_block(
        actor=admin_user,
        name="c",
        image=image,
        group=lab,
        seats=1,
        start=timezone.now() + 3 * H,
        end=timezone.now() + 4 * H,
    )
    services.take_seat(alice if alice.groups.filter(pk=lab.pk).exists() else bob, block, actor=bob)
    carol_in = type(alice).objects.create_user("carol", "c@example.org", "pw")
    carol_in.groups.add(lab)
    with pytest.raises(Exception, match="every seat is taken"):
        services.take_seat(carol_in, block, actor=carol_in)
    assert set(Refusal.objects.values_list("reason", flat=True)) == {"quota", "seats_taken"}
    reasons = {r["reason"]: r for r in usage.report(today, today)["refusals"]}
    assert reasons["quota"]["label"] == "over a quota" and reasons["seats_taken"]["count"] == 1

    client.force_login(admin_user)
    page = client.get("/reservations/usage/").content.decode()
    assert 'id="usage-reclaimed"' in page and 'data-reason="no_show"' in page
    assert api(admin_user).get("/api/v1/usage/").json()["totals"]["reclaimed"] == 1
    client.force_login(alice)
    assert client.get("/reservations/usage/").status_code == 403


def test_the_host_lost_and_idle_events_have_their_mail_kinds(alice, db):
    from django.db import transaction

    with transaction.atomic():
        events.emit(
            "reservation.host_lost",
            {"id": 7, "host": "h1", "outcome": "rebuilding", "reason": "dead"},
            [f"user.{alice.pk}"],
        )
        events.emit(
            "reservation.host_lost",
            {"id": 8, "host": "h1", "outcome": "failed", "reason": "dead"},
            [f"user.{alice.pk}"],
        )
    rows = list(Notification.objects.values_list("kind", "data__id"))
    assert rows == [("host_lost", 7)]  # a failed one is told by its "failed" mail
