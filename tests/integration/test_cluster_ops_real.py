"""Cluster operations on two real KVM hosts (``tests/twohosts.py``) with running guests, through
vclmgr's own services and jobs, as an operator would run them: an ``hbal -X`` plan moves a
reservation's guest live (the same boot, the same process), an ``hsqueeze -X`` plan brings the
guests back onto one host and proposes the other for power-off; verify and repair on real
libvirt (a domain made outside vclmgr, a reservation's domain removed behind vclmgr's back); a
host whose libvirtd dies has its reservation rebuilt on the other host, and when it comes back
verify finds the lost VM there and repair removes it.

One test, in that order, so that the guests boot three times in all (CPU is scarce here): two
reservations on host A, and the rebuild of the one left on the dead host.
"""

import time
from datetime import timedelta

import libvirt
import pytest

from capacity.models import Allocation
from capacity.snapshot import snapshot
from drivers import registry as drivers
from drivers.base import VMState
from inventory import services as inventory
from inventory.models import Hypervisor
from jobs.models import Job
from provisioning import plans, repair, services, tasks
from provisioning.models import VM, Plan
from provisioning.opcodes import host_ops
from reservations import services as reservations
from reservations.models import Reservation
from tests.integration.test_live_migration_real import AGENT_SECONDS, guest_run
from tests.jobs.conftest import sync_jobs  # noqa: F401 (fixture)
from tests.localkvm_inventory import kvm_guest_image, two_kvm_hosts
from tests.provisioning.test_verify import run_verify

pytestmark = pytest.mark.slow
H = timedelta(hours=1)
FOREIGN, ADOPTED = "someones-vm", "leftover-vm"  # domains defined with libvirt directly, not by vclmgr


def foreign_xml(name):
    return f"""<domain type='qemu'><name>{name}</name><memory unit='MiB'>32</memory><vcpu>1</vcpu>
<os><type arch='x86_64'>hvm</type></os></domain>"""


@pytest.fixture(autouse=True)
def _two_checks(settings):
    settings.HOST_OFFLINE_AFTER_CHECKS = 2


def drain(sync_jobs):  # noqa: F811
    sync_jobs.drain(budget=AGENT_SECONDS)


def ready(reservation):
    reservation = Reservation.objects.select_related("vm", "vm__host").get(pk=reservation.pk)
    vm = reservation.vm
    assert reservation.status == "ready", (reservation.status, reservation.error, vm and vm.error)
    assert reservation.vm.state == "running"
    return reservation


def boot_id(host, vm, tag):
    return guest_run(drivers.driver_for(host), vm.key, tag, "cat /proc/sys/kernel/random/boot_id").strip()


def refresh(sync_jobs):  # noqa: F811
    tasks.refresh_all()
    drain(sync_jobs)


def repaired(sync_jobs, admin_user, action, **fields):  # noqa: F811
    job = repair.submit(action, fields, actor=admin_user, source="test")
    drain(sync_jobs)
    job = Job.objects.get(pk=job.pk)
    assert job.status == "success", f"repair.{action}: {job.error_message}"
    return job


def test_plans_verify_repair_and_a_dead_host_on_two_real_hosts(
    two_hosts,
    admin_user,
    alice,
    sync_jobs,  # noqa: F811
    guest_image,
):
    guest = kvm_guest_image(guest_image, "guest-debian", readiness="agent")
    host_a, host_b = two_kvm_hosts(two_hosts, shared=True)

    # Two reservations' guests on A (B drained while they are placed), then B back: unbalanced
    inventory.set_state(host_b, "drained", "the guests go to host-a", actor="test")
    began = time.monotonic()
    booked = [reservations.reserve(alice, guest, actor=alice, duration=2 * H) for _ in range(2)]
    drain(sync_jobs)
    booked = [ready(r) for r in booked]
    assert {r.vm.host_id for r in booked} == {host_a.pk}
    took = {"two reservations ready": time.monotonic() - began}
    inventory.set_state(host_b, "online", "back", actor="test")
    snapshot.expire()
    boots = {r.vm.pk: boot_id(host_a, r.vm, f"boot-{r.vm.pk}") for r in booked}
    sleep = "sleep 10000 </dev/null >/dev/null 2>&1 & echo $!"
    here = drivers.driver_for(host_a)
    sleepers = {r.vm.pk: guest_run(here, r.vm.key, f"sleeper-{r.vm.pk}", sleep).strip() for r in booked}

    # hbal -X: one guest moves live to B
    began = time.monotonic()
    plan = plans.compute("balance", actor=admin_user)
    assert len(plan.moves) == 1 and plan.score_after < plan.score_before, (plan.moves, plan.notes)
    [move] = plan.moves
    assert (move["from"], move["to"]) == (host_a.name, host_b.name)
    plan = plans.execute(plan, actor=admin_user)
    drain(sync_jobs)
    plan = plans.refresh(Plan.objects.get(pk=plan.pk))
    assert plan.state == "done", plan.moves
    [move] = plan.moves
    job = Job.objects.get(pk=move["job"])
    assert (job.opcode, job.status, move["status"]) == ("vm.migrate", "success", "success"), job.error_message
    assert 0 < job.result["migration"]["downtime_ms"] < job.result["migration"]["total_ms"], job.result
    moved = VM.objects.get(pk=move["vm"])
    assert (moved.state, moved.host_id) == ("running", host_b.pk)
    assert drivers.driver_for(host_a).state(moved.key) == VMState.ABSENT
    assert boot_id(host_b, moved, "boot-balanced") == boots[moved.pk]
    there = drivers.driver_for(host_b)
    assert guest_run(there, moved.key, "sleeper-balanced", f"cat /proc/{sleepers[moved.pk]}/comm").strip() == "sleep"
    assert sorted(VM.objects.filter(pk__in=boots).values_list("host_id", flat=True)) == sorted([host_a.pk, host_b.pk])
    took["hbal -X"] = time.monotonic() - began
    print(f"\nhbal -X on real hosts: {job.result['migration']}")

    # hsqueeze -X: back onto one host, the emptied one proposed for power-off (no BMC: drained)
    began = time.monotonic()
    plan = plans.compute("squeeze", actor=admin_user)
    assert len(plan.moves) == 1 and len(plan.power_off) == 1, (plan.moves, plan.power_off, plan.notes)
    [emptied] = plan.power_off
    plans.execute(plan, actor=admin_user)
    drain(sync_jobs)
    plan = plans.refresh(Plan.objects.get(pk=plan.pk))
    assert plan.state == "done", (plan.moves, plan.jobs)
    took["hsqueeze -X"] = time.monotonic() - began
    [move] = plan.moves
    job = Job.objects.get(pk=move["job"])
    assert job.status == "success" and job.result["migration"]["downtime_ms"] > 0, job.result
    print(f"hsqueeze -X on real hosts: {job.result['migration']}")
    emptied = Hypervisor.objects.get(name=emptied)
    assert emptied.state == "drained" and emptied.state_reason == f"emptied by plan {plan.pk}: no BMC to power it off"
    full = host_a if emptied.pk == host_b.pk else host_b
    vms = list(VM.objects.filter(pk__in=boots))
    assert {(vm.state, vm.host_id) for vm in vms} == {("running", full.pk)}
    for vm in vms:
        assert boot_id(full, vm, f"boot-squeezed-{vm.pk}") == boots[vm.pk]
        comm = guest_run(
            drivers.driver_for(full), vm.key, f"sleeper-squeezed-{vm.pk}", f"cat /proc/{sleepers[vm.pk]}/comm"
        )
        assert comm.strip() == "sleep"
    assert drivers.driver_for(emptied).list_vms() == []
    inventory.set_state(emptied, "online", "back after the squeeze", actor="test")
    snapshot.expire()

    # verify and repair on real libvirt: a domain made outside vclmgr, a domain removed behind its back
    foreign_conn = libvirt.open(two_hosts.b.uri)
    try:
        for name in (FOREIGN, ADOPTED):
            foreign_conn.defineXML(foreign_xml(name))
    finally:
        foreign_conn.close()
    gone, kept = booked
    gone_vm = VM.objects.get(pk=gone.vm.pk)
    conn = drivers.driver_for(full).conn
    dom = conn.lookupByName(gone_vm.key)
    dom.destroy()
    dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA)
    _, report = run_verify(sync_jobs, admin_user)
    found = {(f["kind"], f["key"]): f for f in report.findings}
    assert sorted(found) == [("absent", gone_vm.key), ("unknown", ADOPTED), ("unknown", FOREIGN)], report.findings
    assert found[("unknown", FOREIGN)]["host"] == host_b.name and not found[("unknown", FOREIGN)]["ours"]
    assert found[("absent", gone_vm.key)]["host"] == full.name

    repaired(sync_jobs, admin_user, "destroy", host=host_b.name, key=FOREIGN, force=True)
    assert FOREIGN not in [info.key for info in drivers.driver_for(host_b).list_vms()]
    job = repaired(sync_jobs, admin_user, "adopt", host=host_b.name, key=ADOPTED, owner=alice.username)
    adopted = VM.objects.select_related("allocation").get(pk=job.result["vm"])
    assert (adopted.key, adopted.host_id, adopted.owner, adopted.state) == (ADOPTED, host_b.pk, alice, "stopped")
    assert (adopted.vcpus, adopted.memory_mib, adopted.allocation.host_id) == (1, 32, host_b.pk)
    repaired(sync_jobs, admin_user, "absent", vm=gone_vm.pk)
    gone = Reservation.objects.select_related("vm", "allocation").get(pk=gone.pk)
    assert gone.vm.state == "destroyed" and f"vanished from {full.name}" in gone.vm.error
    assert gone.vm.allocation.released is not None
    assert gone.status == "ended" and f"vanished from {full.name}" in gone.history.last().reason
    _, report = run_verify(sync_jobs, admin_user)
    assert report.findings == []
    destroyed = services.submit_action(adopted, "destroy", actor=admin_user)
    drain(sync_jobs)
    assert Job.objects.get(pk=destroyed.pk).status == "success", Job.objects.get(pk=destroyed.pk).error_message
    assert VM.objects.get(pk=adopted.pk).state == "destroyed"
    assert ADOPTED not in [info.key for info in drivers.driver_for(host_b).list_vms()]

    # A dead host: its libvirtd killed while the kept reservation's guest runs there
    dying = two_hosts.a if full.pk == host_a.pk else two_hosts.b
    spare = host_b if full.pk == host_a.pk else host_a
    old_vm = VM.objects.get(pk=kept.vm.pk)
    two_hosts.kill_libvirtd(dying)
    began = time.monotonic()
    refresh(sync_jobs)
    full.refresh_from_db()
    assert full.state == "drained" and full.state_reason.startswith(host_ops.AUTO_DRAIN), full.state_reason
    assert not Job.objects.filter(opcode="node.reprovision").exists()
    refresh(sync_jobs)
    full.refresh_from_db()
    assert full.state == "offline" and full.state_reason.startswith(host_ops.AUTO_OFFLINE), full.state_reason
    job = Job.objects.get(opcode="node.reprovision")
    assert job.status == "success" and job.result["rebuilt"] == [kept.pk], job.error_message
    drain(sync_jobs)
    kept = ready(kept)
    took["dead host: two refreshes, rebuilt and ready"] = time.monotonic() - began
    assert kept.vm.pk != old_vm.pk and kept.vm.host_id == spare.pk
    assert boot_id(spare, kept.vm, "boot-rebuilt") not in boots.values()  # a real boot on the spare host
    old_vm.refresh_from_db()
    assert old_vm.state == "lost" and old_vm.allocation.released is not None

    # It comes back: the lost VM is still defined there; verify finds it, repair destroys it
    two_hosts.restart(dying)
    refresh(sync_jobs)
    full.refresh_from_db()
    assert full.state == "drained" and "1 lost VM(s)" in full.state_reason, full.state_reason
    _, report = run_verify(sync_jobs, admin_user)
    [finding] = report.findings
    assert (finding["kind"], finding["key"], finding["host"]) == ("unknown", old_vm.key, full.name), finding
    assert "has it lost" in finding["message"]
    repaired(sync_jobs, admin_user, "destroy", host=full.name, key=old_vm.key)
    assert VM.objects.get(pk=old_vm.pk).state == "destroyed"
    assert drivers.driver_for(full).list_vms() == []
    _, report = run_verify(sync_jobs, admin_user)
    assert report.findings == []
    assert drivers.driver_for(spare).state(kept.vm.key) == VMState.RUNNING
    assert list(Allocation.objects.filter(released__isnull=True)) == [kept.allocation]
    assert kept.allocation.host_id == spare.pk
    print("; ".join(f"{what}: {seconds:.1f} s" for what, seconds in took.items()))
