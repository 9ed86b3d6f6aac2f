"""A class session's seats warmed from the schedule, in-process on a simulated host: warm VMs of
the image for every seat, made before the seats are built, on claims that end at the session's
start; every seat takes one and is ready before the start; a reservation that needs a warm VM's
room takes it (the seat then boots cold, still ready at the start)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from classes import services
from classes.models import Meeting
from provisioning import warm
from provisioning.models import VM
from reservations import services as reservations
from reservations.models import Reservation

pytestmark = pytest.mark.django_db
SEATS = 30
LEAD = timedelta(minutes=15)  # the class's lead_minutes: its seats are built then


@pytest.fixture
def room(make_host):
    """One host with room for exactly the session's seats (2 GiB each)."""
    return make_host("lab-1", cpus=4 * SEATS, memory_mib=SEATS * 2048, disk_gib=20 * SEATS)


@pytest.fixture
def session(room, image, course, instructor, term, settings):
    settings.CLASS_WARM_MINUTES = 15
    klass = services.create_class(
        actor=instructor, by=instructor, course=course, name="Lab", image=image, seats=SEATS, **term
    )
    return Meeting.objects.filter(klass=klass).first()


def warm_time(meeting):
    """When its seats' warm VMs are wanted: CLASS_WARM_MINUTES before they are built."""
    return meeting.start - LEAD - timedelta(minutes=15)


def seats_of(meeting):
    return Reservation.objects.filter(block=meeting.block).order_by("pk")


def ahead_of(image):
    return VM.objects.filter(image=image, warm="warm", allocation__end__isnull=False).exclude(state__in=warm.GONE)


def test_every_seat_takes_a_vm_warmed_before_it_and_is_ready_before_the_start(session, image, sync_jobs):
    assert warm.fill_round(now=warm_time(session) - timedelta(minutes=1)) == {}  # not yet
    assert warm.fill_round(now=warm_time(session)) == {image.name: {"requested": SEATS}}
    assert warm.fill_round(now=warm_time(session)) == {image.name: {"requested": 0}}  # (still being built)
    sync_jobs.drain()
    made = list(ahead_of(image))
    assert len(made) == SEATS and all(vm.state == "running" and vm.owner is None for vm in made)
    assert all(vm.allocation.yields and vm.allocation.end == session.start for vm in made)
    assert warm.fill_round(now=warm_time(session)) == {image.name: {"requested": 0}}  # idempotent
    assert warm.counts()[image.name]["ahead"] == SEATS

    assert services.plan_round(session.start - LEAD)["built"] == SEATS
    sync_jobs.drain()
    seats = list(seats_of(session))
    assert [s.status for s in seats] == ["ready"] * SEATS
    assert {s.vm_id for s in seats} == {vm.pk for vm in made}  # each took one of them
    for seat in seats:
        assert seat.vm.warm == "hit" and seat.history.last().reason.endswith("warm from the pool")
        # Made before the seat was built, and ready when its build ran (the sync runner's clock does
        # not reach the session's start: bench/class_warm.py measures readiness at the start in real time).
        assert seat.vm.created < seat.history.filter(status="ready").get().at
    # Taken: nothing is left ahead, and the round makes no more
    assert not ahead_of(image) and warm.fill_round(now=session.start - LEAD) == {}


def test_a_reservation_that_needs_a_warm_vms_room_takes_it_and_that_seat_boots_cold(session, image, student, sync_jobs):
    warm.fill_round(now=warm_time(session))
    sync_jobs.drain()
    assert ahead_of(image).count() == SEATS  # the host is full until the session's start

    walk_in = reservations.reserve(student, image, actor=student, duration=timedelta(hours=1))
    sync_jobs.drain()
    walk_in.refresh_from_db()
    assert walk_in.status == "ready"
    assert ahead_of(image).count() == SEATS - 1  # one gave its room up
    evicted = VM.objects.get(image=image, state="destroyed", allocation__end=session.start)
    assert evicted.allocation.released is not None
    assert warm.fill_round(now=warm_time(session)) == {image.name: {"requested": 0}}  # no room: none remade

    reservations.end(walk_in, actor=student)
    sync_jobs.drain()
    services.plan_round(session.start - LEAD)
    sync_jobs.drain()
    seats = list(seats_of(session))
    assert [s.status for s in seats] == ["ready"] * SEATS
    assert sorted(s.vm.warm for s in seats) == [""] + ["hit"] * (SEATS - 1)  # one built cold


def test_no_warm_vms_for_a_session_when_class_warming_is_off(session, image, settings, sync_jobs):
    settings.CLASS_WARM_MINUTES = 0
    assert warm.fill_round(now=warm_time(session)) == {}
    assert services.plan_round(session.start - LEAD)["built"] == SEATS


def test_a_canceled_session_leaves_no_warm_vms_behind(session, image, instructor, sync_jobs):
    warm.fill_round(now=warm_time(session))  # (still being built: the same)
    services.delete_class(session.klass, actor=instructor, now=timezone.now())
    assert warm.fill_round(now=warm_time(session)) == {image.name: {"destroyed": SEATS}}
    sync_jobs.drain()
    assert not ahead_of(image)


@pytest.fixture
def pooled_class(make_host, image, course, instructor, term, settings, sync_jobs):
    """A pooled image (one warm VM) and a one-seat class of it on a big host, warmed: its meeting."""
    from provisioning import services as vms

    make_host("big", cpus=64, memory_mib=64 * 1024, disk_gib=1000)
    settings.CLASS_WARM_MINUTES = 15
    vms.update_image(image, actor="test", warm_min=1, warm_max=1)
    klass = services.create_class(actor=instructor, by=instructor, course=course, name="Lab", image=image, **term)
    meeting = Meeting.objects.filter(klass=klass).first()
    warm.fill_round(now=warm_time(meeting))
    sync_jobs.drain()
    return meeting


def test_a_seat_of_a_pooled_image_takes_a_vm_made_for_seats_and_leaves_the_pools(pooled_class, image, sync_jobs):
    meeting = pooled_class
    [pool] = VM.objects.filter(image=image, warm="warm", allocation__end__isnull=True)  # made first
    made = set(ahead_of(image).values_list("pk", flat=True))
    assert len(made) == 1  # the class's one seat (its course's one member's)
    services.plan_round(meeting.start - LEAD)
    sync_jobs.drain()
    assert set(seats_of(meeting).values_list("vm_id", flat=True)) == made
    pool.refresh_from_db()
    assert pool.warm == "warm" and pool.owner is None


@pytest.mark.usefixtures("pooled_class")
def test_a_walk_in_never_takes_a_vm_warmed_for_a_seat(image, student, sync_jobs):
    made = set(ahead_of(image).values_list("pk", flat=True))
    first = reservations.reserve(student, image, actor=student, duration=timedelta(hours=1))
    second = reservations.reserve(student, image, actor=student, duration=timedelta(hours=1))
    sync_jobs.drain()
    first.refresh_from_db(), second.refresh_from_db()
    assert (first.status, second.status) == ("ready", "ready")
    assert sorted([first.vm.warm, second.vm.warm]) == ["hit", "miss"]  # the pool's one, then a cold build
    assert set(ahead_of(image).values_list("pk", flat=True)) == made  # the seat's is still there


def fill_until(host, until, start=None):
    """A claim of all of ``host``'s room from ``start`` (default now) until ``until``."""
    from capacity import services as capacity

    start = start or timezone.now()
    room = capacity.Demand(vcpus=host.cpus, memory_mib=host.memory_mib, disk_gib=host.disk_gib, start=start, end=until)
    return capacity.claim_on_host(host, room, actor="test")


def another_host(make_host):
    """A second host as big as the first, made after the class placed its seats on the first."""
    from capacity.snapshot import snapshot

    host = make_host("lab-2", cpus=4 * SEATS, memory_mib=SEATS * 2048, disk_gib=20 * SEATS)
    snapshot.expire()  # (the placement looks for new hosts once a second: at once here)
    return host


def test_seats_whose_host_is_full_before_the_session_take_vms_warmed_on_another_host(
    session, room, image, make_host, sync_jobs
):
    fill_until(room, session.start)
    other = another_host(make_host)
    assert warm.fill_round(now=warm_time(session)) == {image.name: {"requested": SEATS}}
    sync_jobs.drain()
    made = list(ahead_of(image))
    assert len(made) == SEATS and {vm.host_id for vm in made} == {other.pk}
    assert all(vm.allocation.yields and vm.allocation.end == session.start for vm in made)
    assert warm.fill_round(now=warm_time(session)) == {image.name: {"requested": 0}}  # counted wherever they run

    services.plan_round(session.start - LEAD)
    sync_jobs.drain()
    seats = list(seats_of(session))
    assert [s.status for s in seats] == ["ready"] * SEATS
    assert {s.vm_id for s in seats} == {vm.pk for vm in made}
    assert all(s.vm.warm == "hit" and s.allocation.host_id == other.pk for s in seats)  # their claims moved
    # Moved, not doubled: nothing is held on the seats' first host during the session any more.
    from capacity.models import Allocation

    during = Allocation.objects.filter(released__isnull=True, start__lt=session.end, end__gt=session.start)
    assert not during.filter(host=room).exists() and during.filter(host=other).count() == SEATS


def test_seats_boot_cold_silently_when_no_host_has_room_to_warm_them(session, room, image, make_host, sync_jobs):
    fill_until(room, session.start)
    other = another_host(make_host)
    fill_until(other, session.end, start=session.start)  # room for a warm VM before the session, none for a seat
    assert warm.fill_round(now=warm_time(session)) == {image.name: {"requested": 0}}
    services.plan_round(session.start - LEAD)
    sync_jobs.drain()
    seats = list(seats_of(session))
    assert [s.status for s in seats] == ["ready"] * SEATS
    assert all(s.vm.warm == "" and s.allocation.host_id == room.pk for s in seats)


def test_seats_warmed_elsewhere_are_sent_no_more_to_a_host_than_it_has_session_room_for(
    make_host, image, course, instructor, term, settings, sync_jobs
):
    from capacity import services as capacity
    from capacity.snapshot import snapshot
    from inventory import services as inventory

    settings.CLASS_WARM_MINUTES = 15
    room = make_host("lab-1", cpus=8, memory_mib=2 * 2048, disk_gib=40)
    klass = services.create_class(
        actor=instructor, by=instructor, course=course, name="Lab", image=image, seats=2, **term
    )
    session = Meeting.objects.filter(klass=klass).first()
    fill_until(room, session.start)
    # b: room for three warm VMs now, for one seat during the session; c: room for one of each,
    # and taken only when b has no room (so b is where a plan that forgets the seats sent goes).
    b = make_host("lab-b", cpus=12, memory_mib=3 * 2048, disk_gib=60)
    busy = capacity.Demand(vcpus=8, memory_mib=2 * 2048, disk_gib=40, start=session.start, end=session.end)
    capacity.claim_on_host(b, busy, actor="test")
    last = inventory.create_node_group(actor="test", name="spare", alloc_policy="last_resort")
    c = make_host("lab-c", cpus=4, memory_mib=2048, disk_gib=20, group=last)
    snapshot.expire()

    assert warm.fill_round(now=warm_time(session)) == {image.name: {"requested": 2}}
    sync_jobs.drain()
    made = list(ahead_of(image))
    assert sorted(vm.host_id for vm in made) == sorted([b.pk, c.pk])  # one seat each, never both on b
    assert warm.fill_round(now=warm_time(session)) == {image.name: {"requested": 0}}

    services.plan_round(session.start - LEAD)
    sync_jobs.drain()
    seats = list(seats_of(session))
    assert [s.status for s in seats] == ["ready", "ready"]
    assert all(s.vm.warm == "hit" for s in seats)  # both moved to their warm VMs: none built cold
