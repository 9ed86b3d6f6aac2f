"""The verify report's repairs, as staff-only jobs, on sim's hypervisor and on libvirt's test
driver: adopt an unknown VM (refused without room), destroy one (a foreign name only when
forced), take the hypervisor's state, mark an absent VM gone (its reservation ends). Each
checks the host again, is idempotent and leaves a change-log entry."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from capacity.models import Allocation
from core.models import ObjectChange
from drivers import registry as drivers
from drivers.sim import services as sim
from drivers.sim.models import SimHost, SimVM
from jobs.models import Job
from provisioning import repair
from provisioning.models import VM
from reservations.models import Reservation
from tests.provisioning.test_libvirt import kvm_host, kvm_image  # noqa: F401 (fixtures)
from tests.provisioning.test_verify import only, run_verify, running_vm

H = timedelta(hours=1)


def foreign_vm(sim_host, key, memory_mib=256, vcpus=1):
    """A VM made on the simulated host behind vclmgr's back."""
    sim.ensure_host(sim_host.name)
    return SimVM.objects.create(
        key=key,
        host=SimHost.objects.get(name=sim_host.name),
        state="running",
        vcpus=vcpus,
        memory_mib=memory_mib,
        disk_gib=1,
        image="by-hand",
        image_format="sim",
        network="default",
        fingerprint="x",
    )


def do(action, admin, sync_jobs, **fields):
    job = repair.submit(action, fields, actor=admin, source="test")
    sync_jobs.drain()
    return Job.objects.get(pk=job.pk)


def test_adopting_an_unknown_vm_claims_its_size_and_verify_is_clean(sim_host, image, alice, admin_user, sync_jobs):
    running_vm(image, alice, sync_jobs)
    foreign_vm(sim_host, "someones-vm", memory_mib=1024, vcpus=2)
    _, report = run_verify(sync_jobs, admin_user)
    assert only(report, "unknown")["key"] == "someones-vm"
    job = do("adopt", admin_user, sync_jobs, host="sim-1", key="someones-vm", owner="alice")
    assert job.status == "success", job.error_message
    vm = VM.objects.get(pk=job.result["vm"])
    assert (vm.key, vm.host, vm.owner, vm.state, vm.vcpus, vm.memory_mib) == (
        "someones-vm",
        sim_host,
        alice,
        "running",
        2,
        1024,
    )
    assert vm.allocation.host == sim_host and vm.allocation.released is None and vm.allocation.end is None
    assert vm.image.name == repair.ADOPTED_IMAGE and not vm.image.active
    assert ObjectChange.objects.filter(object_id=str(vm.pk), action="create", reason__contains="adopted").exists()
    _, report = run_verify(sync_jobs, admin_user)
    assert report.findings == []
    again = do("adopt", admin_user, sync_jobs, host="sim-1", key="someones-vm")
    assert again.status == "success" and again.result == {"vm": vm.pk, "note": "adopted already"}
    assert VM.objects.filter(host_key="someones-vm").count() == 1


def test_adopting_is_refused_when_the_host_lacks_room(make_host, image, admin_user, sync_jobs):
    small = make_host("sim-1", cpus=1, memory_mib=1024, disk_gib=10)
    foreign_vm(small, "big-vm", memory_mib=4096)
    job = do("adopt", admin_user, sync_jobs, host="sim-1", key="big-vm")
    assert job.status == "error" and "no room" in job.error_message and "lack memory" in job.error_message
    assert not VM.objects.filter(host_key="big-vm").exists() and not Allocation.objects.exists()


def test_destroying_an_unknown_vm_needs_force_for_a_foreign_name(sim_host, image, alice, admin_user, sync_jobs):
    mine = running_vm(image, alice, sync_jobs)
    foreign_vm(sim_host, "someones-vm")
    foreign_vm(sim_host, "vcl-9999")
    refused = do("destroy", admin_user, sync_jobs, host="sim-1", key="someones-vm")
    assert refused.status == "error" and "only with force" in refused.error_message
    assert SimVM.objects.filter(key="someones-vm").exists()
    assert do("destroy", admin_user, sync_jobs, host="sim-1", key="someones-vm", force=True).status == "success"
    assert do("destroy", admin_user, sync_jobs, host="sim-1", key="vcl-9999").status == "success"
    assert do("destroy", admin_user, sync_jobs, host="sim-1", key="vcl-9999").status == "success"  # idempotent
    assert sorted(SimVM.objects.values_list("key", flat=True)) == [mine.key]
    known = do("destroy", admin_user, sync_jobs, host="sim-1", key=mine.key)
    assert known.status == "error" and "destroy it as a VM" in known.error_message
    assert ObjectChange.objects.filter(object_id=str(sim_host.pk), reason__contains="vcl-9999 destroyed").exists()
    _, report = run_verify(sync_jobs, admin_user)
    assert report.findings == []


def test_drift_takes_the_hypervisors_state(sim_host, image, alice, admin_user, sync_jobs):
    vm = running_vm(image, alice, sync_jobs)
    SimVM.objects.filter(key=vm.key).update(state="stopped")
    _, report = run_verify(sync_jobs, admin_user)
    job = do("drift", admin_user, sync_jobs, vm=only(report, "drift")["vm"])
    assert job.status == "success", job.error_message
    assert VM.objects.get(pk=vm.pk).state == "stopped"
    assert do("drift", admin_user, sync_jobs, vm=vm.pk).result["note"] == "no drift (any more)"
    assert ObjectChange.objects.filter(object_id=str(vm.pk), reason__contains="took sim-1's state").exists()
    _, report = run_verify(sync_jobs, admin_user)
    assert report.findings == []


def test_an_absent_vm_is_marked_gone_and_its_reservation_ends(sim_host, image, alice, admin_user, sync_jobs):
    from reservations import services as reservations

    reservation = reservations.reserve(alice, image, actor=alice, duration=H)
    sync_jobs.drain()
    reservation.refresh_from_db()
    assert reservation.status == "ready"
    vm = reservation.vm
    refused = do("absent", admin_user, sync_jobs, vm=vm.pk)
    assert refused.status == "error" and "it is not absent" in refused.error_message
    SimVM.objects.filter(key=vm.key).delete()
    _, report = run_verify(sync_jobs, admin_user)
    assert only(report, "absent")["vm"] == vm.pk
    assert do("absent", admin_user, sync_jobs, vm=vm.pk).status == "success"
    vm.refresh_from_db()
    reservation.refresh_from_db()
    assert vm.state == "destroyed" and "vanished from sim-1" in vm.error
    assert reservation.status == "ended" and "vanished from sim-1" in reservation.history.last().reason
    assert not Allocation.objects.filter(released__isnull=True).exists()
    assert do("absent", admin_user, sync_jobs, vm=vm.pk).result["note"] == "gone already"
    _, report = run_verify(sync_jobs, admin_user)
    assert report.findings == []


def test_each_repair_on_libvirt(kvm_host, kvm_image, alice, admin_user, sync_jobs):  # noqa: F811
    gone, stopped = running_vm(kvm_image, alice, sync_jobs), running_vm(kvm_image, alice, sync_jobs)
    driver = drivers.driver_for(kvm_host)
    driver.destroy(gone.key)
    driver.stop(stopped.key, force=True)
    for name in ("someones-vm", "leftover-vm"):
        driver.conn.defineXML(
            f"<domain type='test'><name>{name}</name><memory>262144</memory><vcpu>1</vcpu>"
            "<os><type>hvm</type></os></domain>"
        )
    _, report = run_verify(sync_jobs, admin_user)
    assert sorted(f["kind"] for f in report.findings) == ["absent", "drift", "unknown", "unknown"]
    assert do("adopt", admin_user, sync_jobs, host="kvm-1", key="someones-vm").status == "success"
    adopted = VM.objects.get(host_key="someones-vm")
    assert (adopted.memory_mib, adopted.vcpus, adopted.state, adopted.owner) == (256, 1, "stopped", admin_user)
    assert do("destroy", admin_user, sync_jobs, host="kvm-1", key="leftover-vm", force=True).status == "success"
    assert do("drift", admin_user, sync_jobs, vm=stopped.pk).status == "success"
    assert do("absent", admin_user, sync_jobs, vm=gone.pk).status == "success"
    assert "leftover-vm" not in {info.key for info in driver.list_vms()}
    assert VM.objects.get(pk=stopped.pk).state == "stopped" and VM.objects.get(pk=gone.pk).state == "destroyed"
    _, report = run_verify(sync_jobs, admin_user)
    assert report.findings == []


def test_bad_repair_requests_are_refused_with_the_field(sim_host, admin_user):
    for action, fields, field in (
        ("fix", {}, "action"),
        ("adopt", {"host": "nope", "key": "x"}, "host"),
        ("adopt", {"host": "sim-1", "key": "x", "owner": "nobody"}, "owner"),
    ):
        with pytest.raises(ValidationError) as exc:
            repair.submit(action, fields, actor=admin_user, source="test")
        assert field in exc.value.message_dict
    assert not Job.objects.exists()


def test_repairs_are_staff_only_everywhere(client, api, sim_host, image, alice, admin_user, sync_jobs):
    vm = running_vm(image, alice, sync_jobs)
    foreign_vm(sim_host, "someones-vm")
    before = Job.objects.count()
    body = {"action": "destroy", "host": "sim-1", "key": "someones-vm", "force": True}
    assert api(alice).post("/api/v1/verify/repairs/", body, format="json").status_code == 403
    client.force_login(alice)
    for action in repair.ACTIONS:
        assert (
            client.post(
                f"/vms/verify/repair/{action}/", {"host": "sim-1", "key": "someones-vm", "vm": vm.pk}
            ).status_code
            == 403
        )
    for opcode, params in (
        ("repair.adopt", {"hypervisor": sim_host.pk, "key": "someones-vm"}),
        ("repair.destroy", {"hypervisor": sim_host.pk, "key": "someones-vm", "force": True}),
        ("repair.drift", {"vm": vm.pk}),
        ("repair.absent", {"vm": vm.pk}),
    ):
        response = api(alice).post("/api/v1/jobs/", {"opcode": opcode, "params": params}, format="json")
        assert response.status_code in (400, 403), response.content
    assert Job.objects.count() == before and SimVM.objects.filter(key="someones-vm").exists()
    response = api(admin_user).post("/api/v1/verify/repairs/", body, format="json")
    assert response.status_code == 202, response.content
    assert api(admin_user).post("/api/v1/verify/repairs/", {**body, "extra": 1}, format="json").status_code == 400
    sync_jobs.drain()
    assert Job.objects.get(pk=response.json()["job"]).status == "success"
    assert not SimVM.objects.filter(key="someones-vm").exists()


def test_the_page_offers_each_repair_with_a_confirmation(client, sim_host, image, alice, admin_user, sync_jobs):
    drifting, absent = running_vm(image, alice, sync_jobs), running_vm(image, alice, sync_jobs)
    SimVM.objects.filter(key=drifting.key).update(state="stopped")
    SimVM.objects.filter(key=absent.key).delete()
    foreign_vm(sim_host, "someones-vm")
    Allocation.objects.create(
        host=sim_host, purpose="vm 424242", vcpus=1, memory_mib=256, disk_gib=1, start=timezone.now()
    )
    run_verify(sync_jobs, admin_user)
    client.force_login(admin_user)
    page = client.get("/vms/verify/").content.decode()
    for action in ("adopt", "destroy", "drift", "absent"):
        assert f'action="/vms/verify/repair/{action}/"' in page
    assert page.count("data-confirm=") == 5 and "force (not a vclmgr name)" in page
    response = client.post("/vms/verify/repair/drift/", {"vm": drifting.pk}, follow=True)
    assert "repair.drift submitted as job" in response.content.decode()
    sync_jobs.drain()
    assert VM.objects.get(pk=drifting.pk).state == "stopped"
    assert Reservation.objects.count() == 0
    assert Job.objects.filter(opcode="repair.drift", status="success").count() == 1
