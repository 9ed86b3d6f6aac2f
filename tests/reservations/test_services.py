"""Reservations through their services, VM jobs run in this process on the simulator."""

from dataclasses import replace
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.utils import timezone

from capacity import services as capacity
from capacity.models import Allocation
from core import topics
from core.errors import Conflict
from core.models import Event
from drivers.sim import services as sim
from drivers.sim.models import SimVM
from jobs.models import Job
from provisioning import services as vms
from provisioning.models import VM, QuotaRule
from reservations import services
from reservations.models import Reservation

H = timedelta(hours=1)


def fresh(reservation):
    return Reservation.objects.get(pk=reservation.pk)


def reserve_now(user, image, hours=2, **kwargs):
    return services.reserve(user, image, actor=user, duration=hours * H, **kwargs)


def test_it_reserves_now_and_becomes_ready_with_connection_details(sim_host, image, alice, sync_jobs):
    reservation = reserve_now(alice, image)
    assert reservation.status == "provisioning" and reservation.vm is not None
    assert reservation.allocation.host == sim_host and reservation.allocation.released is None
    sync_jobs.drain()
    reservation = fresh(reservation)
    assert reservation.status == "ready", reservation.error
    details = services.connection(reservation)
    assert details["address"] == reservation.vm.address and details["user"] == "alice"
    assert len(details["password"]) >= 12 and details["command"] == f"ssh alice@{details['address']}"
    assert reservation.connect_secret and details["password"] not in reservation.connect_secret  # encrypted
    statuses = list(reservation.history.values_list("status", flat=True))
    assert statuses == ["pending", "provisioning", "ready"]
    kinds = set(Event.objects.filter(topic=topics.user_topic(alice)).values_list("kind", flat=True))
    assert {"reservation.changed", "vm.changed"} <= kinds


def test_ending_destroys_the_vm_and_releases_the_capacity(sim_host, image, alice, sync_jobs):
    reservation = reserve_now(alice, image)
    sync_jobs.drain()
    services.end(fresh(reservation), actor=alice)
    assert fresh(reservation).status == "ending"
    sync_jobs.drain()
    reservation = fresh(reservation)
    assert reservation.status == "ended" and reservation.connect_secret == ""
    assert reservation.vm.state == "destroyed" and not SimVM.objects.filter(key=reservation.vm.key).exists()
    assert not Allocation.objects.filter(host=sim_host, released__isnull=True).exists()
    with pytest.raises(Conflict):
        services.end(reservation, actor=alice)


def test_a_revert_on_end_image_is_rolled_back_not_destroyed(sim_host, image, alice, sync_jobs):
    vms.update_image(image, actor="test", revert_on_end=True)
    reservation = reserve_now(alice, image)
    sync_jobs.drain()
    vm = VM.objects.get(pk=fresh(reservation).vm_id)
    assert [s["name"] for s in vm.snapshots] == ["clean"]
    services.end(fresh(reservation), actor=alice)
    sync_jobs.drain()
    reservation = fresh(reservation)
    assert reservation.status == "ended", reservation.history.last().reason
    assert reservation.vm.state == "stopped" and "reverted" in reservation.history.last().reason


def test_a_revert_on_end_vm_is_snapshotted_clean_before_its_first_boot(sim_host, image, alice, sync_jobs):
    """The clean state holds no one's login: taken while the VM is defined and stopped."""
    vms.update_image(image, actor="test", revert_on_end=True)
    reservation = reserve_now(alice, image)
    sync_jobs.drain()
    vm = fresh(reservation).vm
    create = Job.objects.get(opcode="vm.create", params__vm=vm.pk)
    steps = [step["name"] for step in create.steps]
    assert steps.index("clean") < steps.index("start")
    snap = SimVM.objects.get(key=vm.key).snapshots[0]
    assert snap["name"] == "clean" and snap["state"] == "stopped" and snap["seed"]["instance_id"]


def test_the_next_user_of_a_revert_on_end_image_gets_the_parked_vm_with_a_fresh_seed(
    sim_host, image, alice, bob, sync_jobs
):
    vms.update_image(image, actor="test", revert_on_end=True)
    first = reserve_now(alice, image)
    sync_jobs.drain()
    vm = fresh(first).vm
    first_seed = SimVM.objects.get(key=vm.key).seed
    services.end(fresh(first), actor=alice)
    sync_jobs.drain()
    assert SimVM.objects.get(key=vm.key).seed == {}  # the last user's seed is not left on the host
    parked = VM.objects.get(pk=vm.pk)
    assert parked.state == "stopped" and parked.owner is None and not vms.visible_vms(alice).exists()

    second = reserve_now(bob, image)
    sync_jobs.drain()
    second = fresh(second)
    assert second.status == "ready", second.error
    assert second.vm_id == vm.pk and second.vm.owner == bob and second.vm.allocation_id == second.allocation_id
    seed = SimVM.objects.get(key=vm.key).seed
    assert seed["instance_id"] != first_seed["instance_id"] and seed["digest"] != first_seed["digest"]
    assert not Allocation.objects.filter(pk=first.allocation_id, released__isnull=True).exists()
    assert VM.objects.filter(image=image).count() == 1


def test_a_reused_vm_that_fails_is_destroyed_and_the_reservation_retried_with_a_new_vm(
    make_host, image, alice, bob, sync_jobs
):
    make_host("sim-1", cpus=8, memory_mib=8192, disk_gib=200)
    make_host("sim-2", cpus=8, memory_mib=8192, disk_gib=200)
    vms.update_image(image, actor="test", revert_on_end=True)
    first = reserve_now(alice, image)
    sync_jobs.drain()
    services.end(fresh(first), actor=alice)
    sync_jobs.drain()
    parked = fresh(first).vm
    sim.set_fault(parked.host.name, "reseed", "fail")
    second = reserve_now(bob, image)
    sync_jobs.drain()
    second = fresh(second)
    assert VM.objects.get(pk=parked.pk).state == "failed" and not SimVM.objects.filter(key=parked.key).exists()
    assert Job.objects.get(opcode="vm.reuse", params__vm=parked.pk).status == "error"
    assert second.status == "ready" and second.vm_id != parked.pk, second.error


def test_a_future_reservation_holds_capacity_and_starts_at_its_lead_time(sim_host, image, alice, sync_jobs):
    start = timezone.now() + 3 * H
    reservation = services.reserve(alice, image, actor=alice, start=start, end=start + 2 * H)
    assert reservation.status == "pending" and reservation.vm is None
    assert reservation.allocation.start == start and reservation.allocation.end == start + 2 * H
    assert services.tick(now=start - 20 * timedelta(minutes=1))["started"] == 0
    assert services.tick(now=start - 5 * timedelta(minutes=1))["started"] == 1
    sync_jobs.drain()
    assert fresh(reservation).status == "ready"
    assert services.tick(now=start + 2 * H + timedelta(seconds=1))["ended"] == 1
    sync_jobs.drain()
    assert fresh(reservation).status == "ended"


def test_the_tick_warns_once_before_the_end(sim_host, image, alice, sync_jobs):
    reservation = reserve_now(alice, image, hours=1)
    sync_jobs.drain()
    soon = fresh(reservation).end - timedelta(minutes=5)
    assert services.tick(now=soon)["warned"] == 1
    assert services.tick(now=soon)["warned"] == 0
    warning = Event.objects.get(kind="reservation.ending", topic=topics.user_topic(alice))
    assert warning.data["id"] == reservation.pk and warning.data["minutes"] == 5


def test_a_future_one_can_be_canceled_and_gives_capacity_back(sim_host, image, alice):
    start = timezone.now() + 3 * H
    reservation = services.reserve(alice, image, actor=alice, start=start, duration=H)
    services.cancel(reservation, actor=alice)
    assert fresh(reservation).status == "canceled"
    assert fresh(reservation).allocation.released is not None


def test_a_started_one_cannot_be_canceled_only_ended(sim_host, image, alice, sync_jobs):
    reservation = reserve_now(alice, image)
    with pytest.raises(Conflict, match="end it instead"):
        services.cancel(reservation, actor=alice)


@pytest.mark.parametrize(
    ("start", "end", "field", "message"),
    [
        (-2 * H, 1 * H, "start", "in the past"),
        (1 * H, 1 * H, "end", "after the start"),
        (2 * H, 1 * H, "end", "after the start"),
        (1 * H, 10 * H, "end", "at most 8 h for debian-12 (the site default)"),
        (24 * 365 * H, 24 * 365 * H + H, "start", "days ahead"),
    ],
)
def test_it_refuses_bad_windows_and_writes_nothing(sim_host, image, alice, start, end, field, message):
    now = timezone.now()
    with pytest.raises(ValidationError) as caught:
        services.reserve(alice, image, actor=alice, start=now + start, end=now + end)
    assert any(message in m for m in caught.value.message_dict[field]), caught.value.message_dict
    assert not Reservation.objects.exists() and not Allocation.objects.exists()


def test_it_refuses_an_image_the_user_may_not_see(sim_host, image, alice, bob):
    students = Group.objects.create(name="students")
    vms.update_image(image, actor="test", visibility="restricted", groups=[students])
    with pytest.raises(ValidationError) as caught:
        reserve_now(alice, image)
    assert caught.value.message_dict == {"image": ["no such image, or you may not use it"]}
    alice.groups.add(students)
    assert reserve_now(alice, image).status == "provisioning"


def test_quotas_name_the_rule_that_refuses(sim_host, image, alice, bob):
    students = Group.objects.create(name="students")
    alice.groups.add(students)
    bob.groups.add(students)
    QuotaRule.objects.create(name="students short", group=students, max_duration_minutes=90)
    QuotaRule.objects.create(name="one each", group=students, max_per_user=1, max_per_group=2)
    with pytest.raises(ValidationError, match=r"at most 1 h 30 min for debian-12 \(rule 'students short'\)"):
        reserve_now(alice, image, hours=2)
    reserve_now(alice, image, hours=1)
    refusal = r"you already have 1 reservation or VM at that time; at most 1 \(rule 'one each'\)"
    with pytest.raises(ValidationError, match=refusal):
        reserve_now(alice, image, hours=1)
    start = timezone.now() + 3 * H
    services.reserve(alice, image, actor=alice, start=start, duration=H)  # not overlapping: allowed
    services.reserve(bob, image, actor=bob, start=start, duration=H)
    carol = type(bob).objects.create_user("carol")
    carol.groups.add(students)
    full = r"group students already has 2 reservations or VMs at that time; at most 2 \(rule 'one each'\)"
    with pytest.raises(ValidationError, match=full):
        services.reserve(carol, image, actor=carol, start=start, duration=H)


def test_no_room_says_why_and_when_it_would_fit(sim_host, image, alice, bob):
    first = reserve_now(alice, image, hours=2, size={"memory_mib": 6144})
    with pytest.raises(ValidationError) as caught:
        reserve_now(bob, image, hours=1, size={"memory_mib": 4096})
    message = caught.value.message_dict["start"][0]
    assert "no host has room then (1 lack memory)" in message
    assert f"the earliest start that fits is {first.end:%Y-%m-%d %H:%M}" in message
    fit = services.check_fit(image, timezone.now(), timezone.now() + H, memory_mib=4096)
    assert not fit.fits and abs((fit.earliest - first.end).total_seconds()) < 1
    assert services.check_fit(image, first.end, first.end + H, memory_mib=4096).fits
    assert Reservation.objects.count() == 1


def test_a_double_submit_makes_one_reservation(sim_host, image, alice):
    one = reserve_now(alice, image, request_key="form-123")
    two = reserve_now(alice, image, request_key="form-123")
    assert one.pk == two.pk and Reservation.objects.count() == 1 and Allocation.objects.count() == 1


def test_extend_moves_the_end_when_there_is_room_and_says_why_not(sim_host, image, alice, bob, sync_jobs):
    reservation = reserve_now(alice, image, hours=1, size={"memory_mib": 4096})
    sync_jobs.drain()
    old_end = fresh(reservation).end
    extended = services.extend(fresh(reservation), old_end + H, actor=alice)
    assert extended.end == old_end + H and extended.allocation.end == old_end + H
    assert VM.objects.get(pk=extended.vm_id).allocation_id == extended.allocation_id
    services.reserve(bob, image, actor=bob, start=old_end + H, duration=H, size={"memory_mib": 6144})
    with pytest.raises(ValidationError, match="cannot extend to .*no host has room then"):
        services.extend(fresh(reservation), old_end + 2 * H, actor=alice)
    assert fresh(reservation).end == old_end + H
    assert Allocation.objects.filter(released__isnull=True).count() == 2
    with pytest.raises(ValidationError, match="at most 8 h"):
        services.extend(fresh(reservation), old_end + 10 * H, actor=alice)


def test_an_end_racing_an_extend_leaves_no_claim_behind(sim_host, image, alice):
    reservation = services.reserve(alice, image, actor=alice, start=timezone.now() + 5 * H, duration=H)
    stale = Reservation.objects.select_related("allocation").get(pk=reservation.pk)  # read before the cancel
    services.cancel(fresh(reservation), actor=alice)  # commits between the extend's read and its write
    with pytest.raises(Conflict, match="changed meanwhile"):
        services.extend(stale, stale.end + H, actor=alice)
    assert fresh(reservation).status == "canceled" and fresh(reservation).end == stale.end
    assert not Allocation.objects.filter(released__isnull=True).exists()


def test_a_vm_that_fails_to_boot_is_retried_once_on_another_host(make_host, image, alice, sync_jobs):
    make_host("sim-1", cpus=8, memory_mib=8192, disk_gib=200)
    make_host("sim-2", cpus=8, memory_mib=8192, disk_gib=200)
    sim.set_fault("sim-1", "start", "fail")
    sim.set_fault("sim-2", "start", "fail")
    reservation = reserve_now(alice, image)
    sync_jobs.drain()
    reservation = fresh(reservation)
    assert reservation.status == "failed" and reservation.attempts == 2
    assert "start" in reservation.error
    assert len(set(reservation.failed_hosts)) == 2
    assert not Allocation.objects.filter(released__isnull=True).exists()
    assert not SimVM.objects.exclude(state="destroyed").exists()


def test_a_retry_lands_on_the_healthy_host(make_host, image, alice, sync_jobs):
    make_host("sim-1", cpus=8, memory_mib=8192, disk_gib=200)
    make_host("sim-2", cpus=8, memory_mib=8192, disk_gib=200)
    reservation = reserve_now(alice, image)
    bad = reservation.allocation.host.name
    sim.set_fault(bad, "start", "fail")
    sync_jobs.drain()
    reservation = fresh(reservation)
    assert reservation.status == "ready", reservation.error
    assert reservation.vm.host.name != bad and reservation.attempts == 2
    reasons = list(reservation.history.values_list("reason", flat=True))
    assert any(r.startswith("retrying on another host") for r in reasons)


def test_block_allocations_claim_every_week_or_nothing(sim_host, image, alice, bob, admin_user):
    klass = Group.objects.create(name="cs101")
    alice.groups.add(klass)
    start = timezone.now() + 24 * H
    block = services.create_block(
        actor=admin_user,
        name="CS101 lab",
        image=image,
        group=klass,
        seats=2,
        start=start,
        end=start + 2 * H,
        weeks=3,
        created_by=admin_user,
    )
    seats = Reservation.objects.filter(block=block)
    assert seats.count() == 6 and seats.filter(user=alice).count() == 3 and seats.filter(user=None).count() == 3
    assert sorted({s.start for s in seats}) == [start, start + timedelta(weeks=1), start + timedelta(weeks=2)]
    with pytest.raises(ValidationError, match="week 1, seat 3 of 3 does not fit"):
        services.create_block(
            actor=admin_user, name="too big", image=image, group=klass, seats=3, start=start, end=start + H, weeks=1
        )
    assert Reservation.objects.count() == 6
    with pytest.raises(ValidationError, match="not in this class"):
        services.take_seat(bob, block, actor=bob)
    bob.groups.add(klass)
    seat = services.take_seat(bob, block, actor=bob)
    assert seat.user == bob and seat.occurrence == 0
    assert services.take_seat(bob, block, actor=bob).pk == seat.pk
    assert services.block_usage(block)["taken"] == 2


def test_block_seats_are_pre_provisioned(sim_host, image, alice, admin_user, sync_jobs):
    klass = Group.objects.create(name="cs101")
    alice.groups.add(klass)
    start = timezone.now() + 5 * timedelta(minutes=1)
    block = services.create_block(
        actor=admin_user, name="now", image=image, group=klass, seats=2, start=start, end=start + H
    )
    sync_jobs.drain()
    seats = Reservation.objects.filter(block=block)
    assert set(seats.values_list("status", flat=True)) == {"ready"}
    assert services.block_usage(block) == {"occurrence": 1, "seats": 2, "taken": 1, "ready": 2, "failed": 0}


def test_reservation_topics_are_authorised(sim_host, image, alice, bob, admin_user):
    reservation = reserve_now(alice, image)
    assert topics.may_subscribe(alice, f"reservation.{reservation.pk}")
    assert not topics.may_subscribe(bob, f"reservation.{reservation.pk}")
    assert topics.may_subscribe(admin_user, f"reservation.{reservation.pk}")
    assert not topics.may_subscribe(bob, "reservation.x")


def _park_one(image, user, sync_jobs):
    vms.update_image(image, actor="test", revert_on_end=True)
    reservation = reserve_now(user, image)
    sync_jobs.drain()
    services.end(fresh(reservation), actor=user)
    sync_jobs.drain()
    return fresh(reservation), VM.objects.get(pk=fresh(reservation).vm_id)


def _live(host):
    return list(Allocation.objects.filter(host=host, released__isnull=True))


def test_a_parked_vm_keeps_its_disk_claimed_on_its_host(sim_host, image, alice, sync_jobs):
    reservation, parked = _park_one(image, alice, sync_jobs)
    assert reservation.status == "ended" and parked.state == "stopped" and parked.owner is None
    [claim] = _live(sim_host)
    assert (claim.vcpus, claim.memory_mib, claim.disk_gib) == (0, 0, parked.disk_gib)
    assert claim.end is None and claim.owner is None and parked.allocation_id == claim.pk
    assert claim.pk != reservation.allocation_id and reservation.allocation.released is not None
    # 200 GiB on the host, 10 of them the parked VM's disk: 195 more do not fit.
    now = timezone.now()
    needs_disk = capacity.Demand(vcpus=1, memory_mib=256, disk_gib=195, start=now, end=now + H, purpose="probe")
    with pytest.raises(capacity.NoCapacity):
        capacity.claim_on_host(sim_host, needs_disk, actor="test")
    assert capacity.claim_on_host(sim_host, replace(needs_disk, disk_gib=190), actor="test")


def test_a_parked_vm_cannot_be_started_on_its_disk_claim(sim_host, image, alice, admin_user, sync_jobs):
    _, parked = _park_one(image, alice, sync_jobs)
    assert vms.run_refusal(parked, "start") and vms.run_refusal(parked, "revert")
    with pytest.raises(Conflict):
        vms.submit_action(parked, "start", actor=admin_user)
    assert vms.run_refusal(parked, "stop") is None


def test_reusing_a_parked_vm_releases_its_disk_claim_for_the_new_one(sim_host, image, alice, bob, sync_jobs):
    _, parked = _park_one(image, alice, sync_jobs)
    parked_claim = parked.allocation
    second = reserve_now(bob, image)
    sync_jobs.drain()
    second = fresh(second)
    assert second.status == "ready" and second.vm_id == parked.pk, second.error
    assert Allocation.objects.get(pk=parked_claim.pk).released is not None
    assert [a.pk for a in _live(sim_host)] == [second.allocation_id] == [second.vm.allocation_id]


def test_destroying_a_parked_vm_releases_its_disk_claim(sim_host, image, alice, admin_user, sync_jobs):
    _, parked = _park_one(image, alice, sync_jobs)
    vms.submit_action(parked, "destroy", actor=admin_user)
    sync_jobs.drain()
    assert VM.objects.get(pk=parked.pk).state == "destroyed" and _live(sim_host) == []


def test_a_reservation_left_ending_by_a_canceled_finish_job_is_finished_by_the_clock(sim_host, image, alice, sync_jobs):
    reservation = services.reserve(alice, image, actor=alice, duration=H)
    sync_jobs.drain()
    services.end(Reservation.objects.get(pk=reservation.pk), actor=alice)
    finish = Job.objects.get(opcode="reservation.finish", params__reservation=reservation.pk)
    Job.objects.filter(pk=finish.pk).update(status=Job.Status.CANCELED)  # an admin canceled it
    assert services.tick(timezone.now() + timedelta(minutes=11))["refinished"] == 0  # its VM's teardown is pending
    sync_jobs.drain()  # the teardown runs; the finish does not
    assert Reservation.objects.get(pk=reservation.pk).status == "ending"
    now = timezone.now()
    assert services.tick(now)["refinished"] == 0  # not yet: its jobs are recent
    later = now + timedelta(minutes=11)
    assert services.tick(later)["refinished"] == 1
    assert services.tick(later)["refinished"] == 0  # once: a finish is queued
    sync_jobs.drain()
    assert Reservation.objects.get(pk=reservation.pk).status == "ended"


def test_ending_a_reservation_whose_build_is_still_queued_leaves_no_vm(sim_host, image, alice, sync_jobs):
    from drivers.sim.models import SimVM

    reservation = services.reserve(alice, image, actor=alice, duration=timedelta(hours=1))
    services.end(reservation, actor=alice)  # its VM is only requested: the build job has not run
    sync_jobs.drain()
    reservation.refresh_from_db()
    assert reservation.status == "ended" and reservation.vm.state == "destroyed"
    assert not SimVM.objects.exists()
