"""Warm pools for reservations on the simulator: an image's sizes, the pool filled by its round,
a reservation taking a warm VM (or built cold when none is warm, or when the warm start fails),
a warm VM's claim yielding to a reservation, and the pool's metrics."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from capacity.models import Allocation
from capacity.snapshot import snapshot
from core import periodic
from drivers import cloudinit
from drivers.base import vm_key
from drivers.sim import services as sim
from drivers.sim.models import SimVM
from jobs.models import Job
from provisioning import services as vms
from provisioning import warm
from provisioning.models import VM
from provisioning.opcodes.guest import guest_login
from reservations import services
from reservations.models import Reservation
from tests.monitoring.helpers import promtool_check, samples, value

pytestmark = pytest.mark.django_db
URL = "/api/v1/images/"
H = timedelta(hours=1)


def test_it_rejects_a_minimum_above_the_maximum(image):
    with pytest.raises(ValidationError) as refused:
        vms.update_image(image, actor="test", warm_min=3, warm_max=2)
    assert refused.value.message_dict["warm_max"] == ["must be at least the minimum (3)"]


def test_it_rejects_a_warm_pool_on_an_image_that_reverts_on_end(image):
    with pytest.raises(ValidationError) as refused:
        vms.update_image(image, actor="test", revert_on_end=True, warm_min=1, warm_max=1)
    assert "reuses its parked VMs" in refused.value.message_dict["warm_max"][0]


def test_an_admin_sets_the_sizes_through_the_api_and_a_user_only_reads_them(api, admin_user, alice, image):
    response = api(admin_user).patch(f"{URL}{image.pk}/", {"warm_min": 1, "warm_max": 2}, format="json")
    assert response.status_code == 200, response.content
    assert (response.json()["warm_min"], response.json()["warm_max"]) == (1, 2)
    assert api(alice).patch(f"{URL}{image.pk}/", {"warm_max": 50}, format="json").status_code == 403
    image.refresh_from_db()
    assert (image.warm_min, image.warm_max) == (1, 2)
    assert api(alice).get(f"{URL}{image.pk}/").json()["warm_max"] == 2
    refused = api(admin_user).patch(f"{URL}{image.pk}/", {"warm_min": 3}, format="json")
    assert refused.status_code == 400 and "warm_max" in refused.json()["error"]["fields"]


# --- filling ----------------------------------------------------------------------------------


def reserve_now(user, image, hours=2, **kwargs):
    return services.reserve(user, image, actor=user, duration=hours * H, **kwargs)


def fresh(row):
    return type(row).objects.get(pk=row.pk)


def warm_ones(image):
    return list(VM.objects.filter(image=image, warm="warm").exclude(state__in=warm.GONE))


def fill(image, sync_jobs):
    done = warm.fill(image)
    sync_jobs.drain()
    return done


@pytest.fixture
def pooled(image):
    return vms.update_image(image, actor="test", default_memory_mib=2048, warm_min=2, warm_max=3)


def test_a_round_fills_the_pool_with_booted_vms_holding_no_login_on_claims_that_yield(sim_host, pooled, sync_jobs):
    assert fill(pooled, sync_jobs) == {"requested": 2}
    vms_warm = warm_ones(pooled)
    assert len(vms_warm) == 2
    for vm in vms_warm:
        assert vm.state == "running" and vm.owner is None and vms.has_warm_snapshot(vm)
        assert vm.allocation.yields and vm.allocation.end is None and vm.allocation.released is None
        seed = guest_login(vm)  # its hostname alone: nobody's login in it
        assert seed.login == "" and not seed.password_hash and not seed.ssh_keys
        assert SimVM.objects.get(key=vm.key).seed["instance_id"].startswith(vm.key)
    assert fill(pooled, sync_jobs) == {"requested": 0}  # at its minimum: nothing more
    vms.update_image(pooled, actor="test", warm_min=1, warm_max=1)
    assert fill(pooled, sync_jobs) == {"destroyed": 1}
    assert len(warm_ones(pooled)) == 1 and SimVM.objects.count() == 1


def test_a_warm_vms_seed_names_it_and_creates_no_user():
    seed = cloudinit.GuestLogin(instance_id="vcl-1-abc", hostname="vcl-1", login="")
    assert "users: []" in cloudinit.user_data(seed) and "passwd" not in cloudinit.user_data(seed)
    with pytest.raises(cloudinit.SeedError):
        cloudinit.GuestLogin(instance_id="vcl-1-abc", hostname="vcl-1", login="", ssh_keys=("ssh-ed25519 AAAA x",))


def test_the_round_fills_only_where_there_is_room_and_takes_none_from_anyone(make_host, image, alice, sync_jobs):
    make_host("small", cpus=4, memory_mib=4096, disk_gib=100)
    reserve_now(alice, image)  # 2 of its 4 GiB
    sync_jobs.drain()
    vms.update_image(image, actor="test", warm_min=3, warm_max=3)
    assert fill(image, sync_jobs) == {"requested": 1}  # one more fits, not three
    assert len(warm_ones(image)) == 1 and Reservation.objects.get().status == "ready"


def test_the_periodic_round_is_scheduled_and_fills_every_pooled_image(sim_host, pooled, sync_jobs):
    from django_q.models import Schedule

    from provisioning import tasks

    try:
        tasks.on_worker_start()
        assert tasks.fill_warm_pools() == {pooled.name: {"requested": 2}}
    finally:
        periodic.stop_daemon("warm-pools")
        periodic.stop_daemon("vm-clock")
    assert Schedule.objects.get(name=tasks.WARM_SCHEDULE).func == tasks.WARM_FUNC


def test_a_warm_vm_that_fails_to_build_holds_its_pool_back_for_a_while(sim_host, pooled, sync_jobs):
    vms.update_image(pooled, actor="test", warm_min=1, warm_max=1)
    sim.set_fault(sim_host.name, "start", "fail")
    fill(pooled, sync_jobs)
    assert VM.objects.get(warm="warm").state == "failed" and not Allocation.objects.filter(released__isnull=True)
    sim.clear_fault(sim_host.name)
    assert fill(pooled, sync_jobs) == {"requested": 0}  # not in a loop: after RETRY_AFTER
    VM.objects.filter(warm="warm").update(updated=timezone.now() - warm.RETRY_AFTER)
    assert fill(pooled, sync_jobs) == {"requested": 1} and len(warm_ones(pooled)) == 1


def test_a_warm_vm_no_reservation_would_take_is_replaced(sim_host, pooled, sync_jobs):
    from provisioning import revisions

    vms.update_image(pooled, actor="test", warm_min=1, warm_max=1)
    fill(pooled, sync_jobs)
    [old] = warm_ones(pooled)
    second = vms.add_revision(
        pooled, actor="test", variants=[{"hypervisor_type": "sim", "format": "sim", "location": "sim://library/v2"}]
    )
    revisions.make_production(second, actor="test")
    assert fill(pooled, sync_jobs) == {"requested": 1, "destroyed": 1}
    [new] = warm_ones(pooled)
    assert fresh(old).state == "destroyed" and new.revision == second
    vms.update_image(pooled, actor="test", default_memory_mib=1024)
    assert fill(pooled, sync_jobs) == {"requested": 1, "destroyed": 1}
    assert [vm.memory_mib for vm in warm_ones(pooled)] == [1024]
    Allocation.objects.filter(pk=warm_ones(pooled)[0].allocation_id).update(yields=False)  # as if moved
    assert fill(pooled, sync_jobs) == {"requested": 1, "destroyed": 1}


def test_an_image_that_stops_pooling_is_emptied_by_the_round(sim_host, pooled, sync_jobs):
    fill(pooled, sync_jobs)
    vms.update_image(pooled, actor="test", warm_min=0, warm_max=0)
    assert warm.fill_round() == {pooled.name: {"destroyed": 2}}
    sync_jobs.drain()
    assert warm_ones(pooled) == [] and not SimVM.objects.exists()
    assert warm.fill_round() == {}


# --- taking -----------------------------------------------------------------------------------


def test_a_reservation_takes_a_warm_vm_and_gets_its_login_and_a_new_identity(sim_host, pooled, alice, bob, sync_jobs):
    fill(pooled, sync_jobs)
    before = {vm.pk: SimVM.objects.get(key=vm.key).seed for vm in warm_ones(pooled)}
    reservation = reserve_now(alice, pooled)
    vm = fresh(reservation).vm
    assert vm.pk in before and vm.warm == "hit" and vm.owner == alice
    sync_jobs.drain()
    reservation = fresh(reservation)
    assert reservation.status == "ready", reservation.error
    assert reservation.history.last().reason.endswith("warm from the pool")
    assert reservation.vm_id == vm.pk and fresh(vm).allocation_id == reservation.allocation_id
    guest = SimVM.objects.get(key=vm.key)
    assert guest.seed != before[vm.pk] and guest.guest["identity"]["hostname"] == vm.key
    job = Job.objects.get(opcode="vm.create", params__vm=vm.pk)
    assert job.result["warm"] is True
    assert [step["name"] for step in job.steps] == ["warm-resume", "warm-login", "warm-address", "warm-ready"]
    assert len(Allocation.objects.filter(released__isnull=True)) == 2  # the reservation's, the other warm VM's

    other = reserve_now(bob, pooled)
    sync_jobs.drain()
    other_guest = SimVM.objects.get(key=fresh(other).vm.key).guest["identity"]
    assert other_guest["host_key"] != guest.guest["identity"]["host_key"]
    assert other_guest["machine_id"] != guest.guest["identity"]["machine_id"]

    services.end(reservation, actor=alice)  # after use: reverted to its warm snapshot, back in the pool
    sync_jobs.drain()
    assert fresh(reservation).status == "ended"
    vm = fresh(vm)
    assert vm.warm == "warm" and vm.owner is None and vm.state == "running" and vm.allocation.yields
    assert SimVM.objects.get(key=vm.key).seed == before[vm.pk]  # alice's login went with the revert
    assert Allocation.objects.get(pk=reservation.allocation_id).released is not None
    assert [step["name"] for step in Job.objects.get(opcode="vm.rewarm").steps] == ["revert", "pool"]

    again = reserve_now(alice, pooled)  # the same VM for its next user: a new identity again
    sync_jobs.drain()
    assert fresh(again).vm_id == vm.pk and fresh(vm).warm_takes == 2
    assert SimVM.objects.get(key=vm.key).guest["identity"]["host_key"] != guest.guest["identity"]["host_key"]


def test_a_vm_taken_warm_is_destroyed_after_use_when_the_pool_is_full(sim_host, pooled, alice, sync_jobs):
    vms.update_image(pooled, actor="test", warm_min=1, warm_max=1)
    fill(pooled, sync_jobs)
    reservation = reserve_now(alice, pooled)
    sync_jobs.drain()
    fill(pooled, sync_jobs)  # the pool is full again meanwhile
    services.end(fresh(reservation), actor=alice)
    sync_jobs.drain()
    vm = fresh(reservation).vm
    assert fresh(reservation).status == "ended" and vm.state == "destroyed"
    assert not SimVM.objects.filter(key=vm.key).exists() and len(warm_ones(pooled)) == 1


def test_with_no_warm_vm_free_the_reservation_is_built_cold_and_counted_a_miss(sim_host, pooled, alice, sync_jobs):
    reservation = reserve_now(alice, pooled)
    sync_jobs.drain()
    reservation = fresh(reservation)
    assert reservation.status == "ready" and reservation.vm.warm == "miss"
    assert reservation.history.last().reason.endswith("built cold")


def test_a_warm_vm_on_another_host_takes_the_reservation_s_claim_there(make_host, pooled, alice, sync_jobs):
    first = make_host("one", cpus=8, memory_mib=8192)
    vms.update_image(pooled, actor="test", warm_min=1, warm_max=1)
    fill(pooled, sync_jobs)
    [vm] = warm_ones(pooled)
    assert vm.host == first
    make_host("two", cpus=64, memory_mib=65536)  # emptier: the balanced placement picks it
    snapshot.expire()
    reservation = reserve_now(alice, pooled)
    reservation = fresh(reservation)
    assert reservation.vm_id == vm.pk and reservation.allocation.host == first
    assert Allocation.objects.filter(released__isnull=True, host__name="two").count() == 0
    sync_jobs.drain()
    assert fresh(reservation).status == "ready"


def test_a_reservation_made_ahead_takes_a_warm_vm_when_it_starts_its_claim_moving_there(
    make_host, pooled, alice, sync_jobs
):
    from reservations import schedule

    make_host("one", cpus=8, memory_mib=3072)
    vms.update_image(pooled, actor="test", warm_min=1, warm_max=1)
    fill(pooled, sync_jobs)
    [vm] = warm_ones(pooled)
    make_host("two", cpus=64, memory_mib=65536)
    snapshot.expire()  # (hosts are looked for at most once a second)
    start = timezone.now() + 3 * H
    later = services.reserve(alice, pooled, actor=alice, start=start, duration=H)
    assert later.allocation.host.name == "two"  # the warm VM leaves no room beside it on "one"
    schedule.tick(now=start)
    later = fresh(later)
    assert later.vm_id == vm.pk and later.allocation.host.name == "one" and later.allocation.start == start
    assert Allocation.objects.filter(released__isnull=True, host__name="two").count() == 0
    sync_jobs.drain()
    assert fresh(later).status == "ready" and fresh(later).history.last().reason.endswith("warm from the pool")


def test_a_guest_that_refuses_the_login_is_destroyed_and_the_same_vm_built_cold(sim_host, pooled, alice, sync_jobs):
    vms.update_image(pooled, actor="test", warm_min=1, warm_max=1)
    fill(pooled, sync_jobs)
    [taken] = warm_ones(pooled)
    sim.set_fault(sim_host.name, "personalise", "fail")
    reservation = reserve_now(alice, pooled)
    sync_jobs.drain()
    reservation = fresh(reservation)
    assert reservation.status == "ready", reservation.error
    assert reservation.vm_id == taken.pk and reservation.vm.warm == "miss"
    assert reservation.history.last().reason.endswith("built cold")
    job = Job.objects.get(opcode="vm.create", params__vm=taken.pk)
    names = [step["name"] for step in job.steps]
    assert names[:2] == ["warm-resume", "cold"] and "define" in names  # the login step failed
    guest = SimVM.objects.get(key=taken.key)
    assert guest.seed["instance_id"].startswith(taken.key) and "identity" not in guest.guest  # a new VM, seeded
    assert Allocation.objects.filter(released__isnull=True).count() == 1  # the reservation's only


# --- eviction ---------------------------------------------------------------------------------


def test_a_reservation_that_fits_only_in_a_warm_vm_s_room_evicts_it(make_host, image, alice, bob, sync_jobs):
    make_host("small", cpus=4, memory_mib=4096, disk_gib=100)
    vms.update_image(image, actor="test", warm_min=2, warm_max=2)
    fill(image, sync_jobs)  # the host is full of warm VMs
    assert len(warm_ones(image)) == 2
    big = reserve_now(alice, image, size={"memory_mib": 3072})  # not their size: it cannot take one
    assert fresh(big).vm.warm == "miss"
    sync_jobs.drain()
    assert fresh(big).status == "ready", fresh(big).error
    assert len(warm_ones(image)) == 0 and SimVM.objects.count() == 1  # both made way
    later = services.reserve(bob, image, actor=bob, start=timezone.now() + 3 * H, duration=H)
    assert later.status == "pending"
    assert fill(image, sync_jobs) == {"requested": 0}  # no room left beside the reservation


def test_a_future_reservation_evicts_a_warm_vm_rather_than_being_refused(make_host, image, alice, sync_jobs):
    make_host("small", cpus=4, memory_mib=4096, disk_gib=100)
    vms.update_image(image, actor="test", warm_min=2, warm_max=2)
    fill(image, sync_jobs)
    fit = services.check_fit(image, timezone.now() + H, timezone.now() + 2 * H, memory_mib=4096)
    assert fit.fits, fit.message
    later = services.reserve(alice, image, actor=alice, start=timezone.now() + H, duration=H, size={"memory_mib": 4096})
    sync_jobs.drain()
    assert later.allocation.released is None and len(warm_ones(image)) == 0


def test_the_pool_never_refuses_what_fits_without_it(make_host, image, alice, bob, sync_jobs):
    make_host("small", cpus=4, memory_mib=4096, disk_gib=100)
    vms.update_image(image, actor="test", warm_min=2, warm_max=2)
    fill(image, sync_jobs)
    mine = [reserve_now(user, image) for user in (alice, bob)]  # each takes a warm VM: both fit
    sync_jobs.drain()
    assert [fresh(r).status for r in mine] == ["ready", "ready"]
    assert {fresh(r).vm.warm for r in mine} == {"hit"}


# --- metrics ----------------------------------------------------------------------------------


def test_metrics_show_each_pools_warm_vms_hits_and_misses(sim_host, pooled, alice, bob, client, settings, sync_jobs):
    settings.METRICS_TOKEN = "metrics-token-for-the-test-0123456789"  # noqa: S105 (a test token)
    vms.update_image(pooled, actor="test", warm_min=1, warm_max=1)
    fill(pooled, sync_jobs)
    reserve_now(alice, pooled)  # takes the warm VM
    reserve_now(bob, pooled)  # none left: cold
    sync_jobs.drain()
    fill(pooled, sync_jobs)  # the pool is topped up again
    answer = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {settings.METRICS_TOKEN}")
    text = answer.content.decode()
    ok, output = promtool_check(text)
    assert ok, output
    found = samples(text)
    assert value(found, "vclmgr_warm_vms", image=pooled.name, state="ready") == 1
    assert value(found, "vclmgr_warm_in_use", image=pooled.name) == 1
    assert value(found, "vclmgr_warm_hits_total", image=pooled.name) == 1
    assert value(found, "vclmgr_warm_misses_total", image=pooled.name) == 1


# --- hosts leaving service ----------------------------------------------------------------------


def on_host(host):
    return sorted(VM.objects.filter(host=host, warm="warm").exclude(state__in=warm.GONE).values_list("pk", flat=True))


@pytest.fixture
def two_pooled_hosts(make_host, pooled, alice, sync_jobs):
    """Host "one" with two warm VMs and a reservation's VM taken warm from the pool; "two" empty."""
    one = make_host("one", cpus=8, memory_mib=8192)
    fill(pooled, sync_jobs)
    taken = reserve_now(alice, pooled)
    fill(pooled, sync_jobs)  # topped up again beside it
    sync_jobs.drain()
    assert fresh(taken).status == "ready" and len(on_host(one)) == 2
    two = make_host("two", cpus=8, memory_mib=8192)
    snapshot.expire()  # (hosts are looked for at most once a second)
    return one, two, fresh(taken)


def test_draining_a_host_destroys_its_warm_vms_and_the_pool_refills_elsewhere(two_pooled_hosts, pooled, sync_jobs):
    from inventory import services as inventory

    one, two, taken = two_pooled_hosts
    leaving = on_host(one)
    inventory.set_state(one, "drained", "disk replacement", actor="test")
    assert warm_ones(pooled) == []  # out of the pool at once: no reservation takes them meanwhile
    sync_jobs.drain()
    assert {fresh(VM(pk=pk)).state for pk in leaving} == {"destroyed"}
    assert not SimVM.objects.filter(key__in=[vm_key(pk) for pk in leaving]).exists()
    assert not Job.objects.filter(opcode="vm.migrate").exists()  # never moved
    assert fresh(taken).status == "ready" and fresh(taken).vm.host == one  # a user's VM: left for an evacuation
    assert fill(pooled, sync_jobs) == {"requested": 2}
    assert len(on_host(two)) == 2 and on_host(one) == []


def test_a_warm_vm_taken_while_its_host_is_drained_stays_its_users(two_pooled_hosts, pooled, sync_jobs, monkeypatch):
    from inventory import services as inventory

    one, _, _ = two_pooled_hosts
    first, *others = on_host(one)
    key_of = warm.vm_key

    def taken_meanwhile(pk):  # a reservation takes the first one between the drain's read and its destroy
        if pk == first:
            VM.objects.filter(pk=pk).update(warm=VM.Warm.HIT)
        return key_of(pk)

    monkeypatch.setattr(warm, "vm_key", taken_meanwhile)
    inventory.set_state(one, "drained", "disk replacement", actor="test")
    sync_jobs.drain()
    assert fresh(VM(pk=first)).state != "destroyed"
    assert not Job.objects.filter(opcode="vm.destroy", params__vm=first).exists()
    assert others and {fresh(VM(pk=pk)).state for pk in others} == {"destroyed"}


def test_evacuating_a_host_migrates_its_reservations_and_destroys_its_warm_vms(two_pooled_hosts, pooled, sync_jobs):
    from jobs import services as jobs

    one, two, taken = two_pooled_hosts
    leaving = on_host(one)
    job = jobs.submit("node.evacuate", {"hypervisor": one.pk}, actor="test")
    sync_jobs.drain()
    assert Job.objects.get(pk=job.pk).status == "success"
    moved = Job.objects.filter(opcode="vm.migrate")
    assert [(m.params["vm"], m.status) for m in moved] == [(taken.vm_id, "success")]  # the user's VM only
    assert fresh(taken).vm.host == two and fresh(taken).status == "ready"
    assert {fresh(VM(pk=pk)).state for pk in leaving} == {"destroyed"}
    assert fill(pooled, sync_jobs) == {"requested": 2} and len(on_host(two)) == 2


# --- licence caps -------------------------------------------------------------------------------


def test_warm_vms_hold_no_seat_of_the_image_s_licence_cap(sim_host, pooled, alice, bob, sync_jobs):
    """A licence cap counts users' reservations and VMs: a warm VM is nobody's (no login, no
    licensed session), so it takes no seat; the reservation that takes it takes one."""
    vms.update_image(pooled, actor="test", warm_min=1, warm_max=1, max_concurrent=1)
    fill(pooled, sync_jobs)
    mine = reserve_now(alice, pooled)  # a warm VM exists: the cap of 1 still lets one user in
    assert fresh(mine).vm.warm == "hit"
    fill(pooled, sync_jobs)  # topped up beside it
    with pytest.raises(ValidationError, match=r"may run at most 1 at once \(its licence cap\)"):
        reserve_now(bob, pooled)
    assert len(warm_ones(pooled)) == 1  # the refused reservation took nothing from the pool
    sync_jobs.drain()
    services.end(fresh(mine), actor=alice)
    sync_jobs.drain()
    assert fresh(reserve_now(bob, pooled)).vm.warm == "hit"  # the seat is free again


def test_it_rejects_a_pool_larger_than_the_licence_cap(pooled):
    with pytest.raises(ValidationError) as refused:
        vms.update_image(pooled, actor="test", max_concurrent=2)  # the pool keeps up to 3
    assert refused.value.message_dict["warm_max"] == ["at most the image's licence cap (2): more could never be used"]


# --- sized from the usage history ------------------------------------------------------------


def test_the_pool_wants_what_the_same_hour_of_past_weeks_started(sim_host, pooled, alice, settings, sync_jobs):
    settings.WARM_HISTORY_WEEKS, settings.WARM_HISTORY_PERCENTILE = 4, 50
    now = timezone.now()
    vms.update_image(pooled, actor="test", warm_min=1, warm_max=3)
    started = {1: 3, 2: 2, 3: 2, 4: 0}  # weeks ago: reservations started within the hour from then
    size = vms.size_for(pooled)

    def past(start):
        return Reservation(user=alice, image=pooled, start=start, end=start + H, status="ended", **size)

    ago = timedelta(weeks=1)
    Reservation.objects.bulk_create(
        past(now - w * ago + timedelta(minutes=10 + i)) for w, n in started.items() for i in range(n)
    )
    Reservation.objects.bulk_create([past(now - ago - 2 * H), past(now - ago + 2 * H)])  # other hours
    assert warm.wanted_counts([pooled], now) == {pooled.pk: 2}  # the median of 3, 2, 2, 0
    assert warm.counts(now)[pooled.name]["wanted"] == 2
    assert fill(pooled, sync_jobs) == {"requested": 2}
    vms.update_image(pooled, actor="test", warm_min=0, warm_max=1)
    assert warm.wanted_counts([pooled], now) == {pooled.pk: 1}  # within its maximum
    settings.WARM_HISTORY_WEEKS = 0
    vms.update_image(pooled, actor="test", warm_min=1, warm_max=3)
    assert warm.wanted_counts([pooled], now) == {pooled.pk: 1}  # no history: the minimum
