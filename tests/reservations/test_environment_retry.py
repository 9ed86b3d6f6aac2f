"""A machine of an environment whose build fails is built again on another host, with the
machines its networks join it to there, once; when no host fits them all, or the retry is
spent, the whole environment fails and nothing of it stays on any host."""

from datetime import timedelta

import pytest

from capacity.models import Allocation
from drivers.sim import services as sim
from drivers.sim.models import SimNetwork, SimVM
from provisioning.models import VM, PrivateNetwork
from reservations import services
from reservations.models import Reservation
from tests.environments.conftest import debian, make_template, member, router_image  # noqa: F401 (fixtures)
from tests.reservations.test_environments import lab, machines  # noqa: F401 (fixture)

H = timedelta(hours=1)


def host_of(head):
    return Reservation.objects.get(pk=head.pk).allocation.host


def nothing_left(*hosts):
    assert not SimVM.objects.filter(host__name__in=[h.name for h in hosts]).exists()
    assert not SimNetwork.objects.filter(host__name__in=[h.name for h in hosts]).exists()
    assert not Allocation.objects.filter(released__isnull=True).exists()
    assert not VM.objects.exclude(state__in=("destroyed", "failed")).exists()


def test_a_failed_machine_is_built_again_elsewhere_with_its_networks_machines(make_host, lab, alice, sync_jobs):  # noqa: F811
    make_host("one", cpus=16, memory_mib=16384)
    make_host("two", cpus=16, memory_mib=16384)
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    first = host_of(head)
    sim.set_fault(first.name, "start", "fail_once")  # the first to boot fails; the others boot there
    sync_jobs.drain()
    rows = machines(head)
    assert {n: r.status for n, r in rows.items()} == dict.fromkeys(rows, "ready"), {n: r.error for n, r in rows.items()}
    other = host_of(head)
    assert other != first and {r.allocation.host_id for r in rows.values()} == {other.pk}  # still together
    # Nothing of it stays on the host that failed: no VM, no network, no claim.
    assert not SimVM.objects.filter(host__name=first.name).exists()
    assert not SimNetwork.objects.filter(host__name=first.name).exists()
    assert not Allocation.objects.filter(host=first, released__isnull=True).exists()
    assert set(SimNetwork.objects.filter(host__name=other.name).values_list("key", flat=True)) == {
        f"env{head.pk}r2-left",
        f"env{head.pk}r2-right",
    }
    assert set(PrivateNetwork.objects.filter(removed__isnull=True).values_list("host__name", flat=True)) == {other.name}
    # Each machine on its networks by name, on the new host.
    for row in rows.values():
        vm = VM.objects.get(pk=row.vm_id)
        assert vm.host_id == other.pk and vm.state == "running"
        assert {n.key.split("-")[0] for n in vm.networks.all()} == {f"env{head.pk}r2"}
    # The trail says what was retried where and why.
    trail = " ".join(Reservation.objects.get(pk=head.pk).history.values_list("reason", flat=True))
    assert f"on {other.name} after" in trail and f"failed on {first.name}" in trail, trail
    assert VM.objects.filter(state="running").count() == 3


def test_no_other_host_with_room_for_the_group_fails_the_environment_whole(make_host, lab, alice, sync_jobs):  # noqa: F811
    big = make_host("big", cpus=16, memory_mib=16384)
    small = make_host("small", cpus=16, memory_mib=1024)  # one machine fits, the group does not
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    assert host_of(head) == big
    sim.set_fault(big.name, "start", "fail_once")
    sync_jobs.drain()
    rows = machines(head)
    assert "failed" in {r.status for r in rows.values()} and {r.status for r in rows.values()} <= {"failed", "ended"}
    error = Reservation.objects.get(pk=head.pk).error
    assert "the environment failed" in error and "no other host for a retry" in error, error
    nothing_left(big, small)


def test_a_group_that_fails_again_is_not_retried_twice(make_host, lab, alice, sync_jobs):  # noqa: F811
    one = make_host("one", cpus=16, memory_mib=16384)
    two = make_host("two", cpus=16, memory_mib=16384)
    three = make_host("three", cpus=16, memory_mib=16384)
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    for host in (one, two, three):
        sim.set_fault(host.name, "start", "fail")
    sync_jobs.drain()
    rows = machines(head)
    assert {r.status for r in rows.values()} <= {"failed", "ended"}
    error = Reservation.objects.get(pk=head.pk).error
    assert "retried once already" in error, error
    used = {h for r in rows.values() for h in r.failed_hosts}
    assert len(used) == 2  # the first host and one retry, not a third
    nothing_left(one, two, three)


@pytest.fixture
def islands(alice, debian, make_template):  # noqa: F811 (fixtures)
    """Two machines on a network and one on none: the lone one goes wherever it fits."""
    return make_template(
        alice,
        [
            member("gw", debian, "lan", entry=True, memory_mib=512),
            member("db", debian, "lan", memory_mib=512),
            member("solo", debian, "side", memory_mib=512),
        ],
        [{"name": "lan", "cidr": "192.168.40.0/24"}, {"name": "side", "cidr": "192.168.41.0/24"}],
        name="islands",
    )


def test_a_lone_machine_is_retried_alone(make_host, islands, alice, sync_jobs):
    make_host("one", cpus=16, memory_mib=16384)
    make_host("two", cpus=16, memory_mib=16384)
    head = services.reserve_environment(alice, islands, actor=alice, duration=2 * H)
    rows = machines(head)
    solo = rows["solo"].allocation.host
    pair = rows["gw"].allocation.host
    assert solo != pair  # (apart: they share no network)
    sim.set_fault(solo.name, "create", "fail")
    sync_jobs.drain()
    rows = machines(head)
    assert {n: r.status for n, r in rows.items()} == dict.fromkeys(rows, "ready"), {n: r.error for n, r in rows.items()}
    assert rows["solo"].allocation.host_id == pair.pk and rows["solo"].attempts == 2
    assert rows["gw"].attempts == rows["db"].attempts == 1  # the pair was not moved


@pytest.fixture
def defined(monkeypatch):
    """The keys of the VMs the simulator was asked to define, in order."""
    from drivers.sim.driver import SimDriver

    keys, create = [], SimDriver.create

    def spy(self, spec):
        keys.append(spec.key)
        return create(self, spec)

    monkeypatch.setattr(SimDriver, "create", spy)
    return keys


def test_a_retry_leaves_the_old_machines_queued_builds_defining_nothing(make_host, lab, alice, sync_jobs, defined):  # noqa: F811
    from jobs.models import Job
    from reservations import settling

    one = make_host("one", cpus=16, memory_mib=16384)
    make_host("two", cpus=16, memory_mib=16384)
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    assert host_of(head) == one
    sim.set_fault(one.name, "create", "fail_once")
    first, _ = sync_jobs.run_one()  # one machine's build fails; the others' builds are still queued
    [failed] = [r for r in machines(head).values() if r.vm.state == "failed"]
    waiting = {r.vm_id: r.vm.key for r in machines(head).values() if r.pk != failed.pk}
    assert set(VM.objects.filter(pk__in=waiting).values_list("state", flat=True)) == {"requested"}
    settling.settle(failed.pk, actor=alice)  # its retry, before those builds ran
    sync_jobs.drain()
    rows = machines(head)
    assert {n: r.status for n, r in rows.items()} == dict.fromkeys(rows, "ready"), {n: r.error for n, r in rows.items()}
    # The superseded VMs were never defined on the first host: only the new ones were, elsewhere.
    assert not set(waiting.values()) & set(defined), defined
    assert set(defined) == {VM.objects.get(pk=first_vm).key for first_vm in [failed.vm_id]} | {
        r.vm.key for r in rows.values()
    }
    assert set(VM.objects.filter(pk__in=waiting).values_list("state", flat=True)) == {"destroyed"}
    builds = Job.objects.filter(opcode="vm.create", params__vm__in=list(waiting))
    assert {b.status for b in builds} == {"error"} and all("to be destroyed" in b.error_message for b in builds)
    nothing = SimVM.objects.filter(host__name=one.name).exists() or SimNetwork.objects.filter(host__name=one.name)
    assert not nothing


def test_a_build_superseded_while_it_runs_defines_nothing(make_host, lab, alice, sync_jobs, defined, monkeypatch):  # noqa: F811
    from jobs import services as jobs
    from jobs.models import Job
    from provisioning.opcodes import lifecycle

    host = make_host("one", cpus=16, memory_mib=16384)
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    target = machines(head)["client"].vm
    stage = lifecycle.stage

    def staged_then_superseded(vm_id, *args, **kwargs):
        done = stage(vm_id, *args, **kwargs)
        if vm_id == target.pk:  # its build has begun: a destroy is asked for it now
            jobs.submit("vm.destroy", {"vm": vm_id}, actor=alice, submitter=alice, reason="superseded")
        return done

    monkeypatch.setattr(lifecycle, "stage", staged_then_superseded)
    sync_jobs.drain()
    build = Job.objects.get(opcode="vm.create", params__vm=target.pk)
    assert build.status == "error" and "to be destroyed" in build.error_message, build.error_message
    assert target.key not in defined and len(defined) >= 2  # the others were defined
    assert VM.objects.get(pk=target.pk).state == "destroyed"
    assert not SimVM.objects.filter(key=target.key).exists()
    assert host_of(head) == host


def test_machines_whose_host_left_service_before_their_build_move_together(
    make_host,
    lab,  # noqa: F811 (fixture)
    alice,
    admin_user,
    sync_jobs,
):
    from inventory import services as inventory

    one = make_host("one", cpus=16, memory_mib=16384)
    two = make_host("two", cpus=16, memory_mib=16384)
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    assert host_of(head) == one
    inventory.set_state(one, "offline", "rack move", actor=admin_user)  # before any machine was built
    sync_jobs.drain()
    rows = machines(head)
    assert {n: r.status for n, r in rows.items()} == dict.fromkeys(rows, "ready"), {n: r.error for n, r in rows.items()}
    # Together on the other host, on networks recorded there: none was moved alone off its networks.
    assert {VM.objects.get(pk=r.vm_id).host_id for r in rows.values()} == {two.pk}
    for row in rows.values():
        assert {n.host_id for n in VM.objects.get(pk=row.vm_id).networks.all()} == {two.pk}
    assert set(SimNetwork.objects.filter(host__name=two.name).values_list("key", flat=True)) == {
        f"env{head.pk}r2-left",
        f"env{head.pk}r2-right",
    }
    assert not SimVM.objects.filter(host__name=one.name).exists()
