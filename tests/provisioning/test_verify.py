"""cluster.verify against the hypervisors: each kind of drift injected for real on sim's
"hypervisor" (its own tables) and on libvirt's test driver, found and reported."""

from datetime import timedelta

import pytest
from django.utils import timezone
from django_q.models import Schedule

from capacity import services as capacity
from capacity.models import Allocation
from core.errors import Conflict
from drivers import registry as drivers
from drivers.sim import services as sim
from drivers.sim.models import SimHost, SimVM
from jobs import services as jobs
from jobs.models import Job
from provisioning import services, tasks, verify
from provisioning.models import VM, VerifyReport
from reservations.models import Reservation
from tests.provisioning.test_libvirt import kvm_host, kvm_image  # noqa: F401 (fixtures)


def running_vm(image, owner, sync_jobs):
    vm, _ = services.request_vm(actor=owner, owner=owner, image=image)
    sync_jobs.drain()
    vm = VM.objects.get(pk=vm.pk)
    assert vm.state == "running", vm.error
    return vm


def run_verify(sync_jobs, admin_user):
    job = jobs.submit("cluster.verify", {}, actor=admin_user)
    sync_jobs.drain()
    job = Job.objects.get(pk=job.pk)
    report = VerifyReport.objects.get(job_id=job.pk)
    return job, report


def kinds(report):
    return sorted(f["kind"] for f in report.findings)


def only(report, kind):
    found = [f for f in report.findings if f["kind"] == kind]
    assert len(found) == 1, report.findings
    return found[0]


def test_a_clean_cluster_has_no_findings(migrated_schedules, sim_host, image, alice, admin_user, sync_jobs):
    running_vm(image, alice, sync_jobs)
    job, report = run_verify(sync_jobs, admin_user)
    assert job.status == "success", job.error_message
    assert report.findings == [] and report.hosts_checked == 1


def test_each_drift_on_sim_is_found(sim_host, make_host, image, alice, admin_user, sync_jobs):
    gone, stopped, unclaimed = (running_vm(image, alice, sync_jobs) for _ in range(3))
    host = SimHost.objects.get(name=sim_host.name)
    template = SimVM.objects.get(key=gone.key)
    SimVM.objects.filter(key=gone.key).delete()  # (2) vclmgr thinks it exists; the host lost it
    SimVM.objects.filter(key=stopped.key).update(state="stopped")  # (3) drift
    for key in ("someones-vm", "vcl-9999"):  # (1) one foreign, one named like ours
        SimVM.objects.create(
            key=key,
            host=host,
            state="running",
            vcpus=1,
            memory_mib=256,
            disk_gib=1,
            image=template.image,
            image_format=template.image_format,
            network=template.network,
            fingerprint="x",
        )
    capacity.release(unclaimed.allocation, actor="test")  # (5) a live VM without a claim
    orphan = Allocation.objects.create(
        host=sim_host, purpose="vm 424242", vcpus=1, memory_mib=256, disk_gib=1, start=timezone.now()
    )  # (4) a claim left behind
    dead = make_host("sim-dead")
    sim.ensure_host("sim-dead")
    sim.set_fault("sim-dead", "list_vms", "unreachable")

    job, report = run_verify(sync_jobs, admin_user)
    assert job.status == "error" and "problems found" in job.error_message
    assert kinds(report) == ["absent", "drift", "orphan_claim", "unclaimed_vm", "unknown", "unknown", "unreachable"]
    assert only(report, "absent")["message"] == f"{gone.key} is running in vclmgr but absent on sim-1"
    assert only(report, "drift")["message"] == f"{stopped.key} is running in vclmgr but stopped on sim-1"
    unknown = {f["key"]: f for f in report.findings if f["kind"] == "unknown"}
    assert unknown["someones-vm"]["ours"] is False and "not a vclmgr name" in unknown["someones-vm"]["message"]
    assert unknown["vcl-9999"]["ours"] is True and "has no such VM" in unknown["vcl-9999"]["message"]
    assert only(report, "orphan_claim")["allocation"] == orphan.pk
    assert only(report, "unclaimed_vm")["vm"] == unclaimed.pk
    # the silent host is reported as such, not as having lost its VMs
    assert only(report, "unreachable")["host"] == dead.name
    assert "did not answer" in only(report, "unreachable")["message"]


def test_a_vm_in_error_that_its_host_lost_is_absent(sim_host, image, alice, admin_user, sync_jobs):
    vm = running_vm(image, alice, sync_jobs)
    services.set_state(vm.pk, VM.State.ERROR, "destroy failed: test", actor="test")
    SimVM.objects.filter(key=vm.key).delete()
    _, report = run_verify(sync_jobs, admin_user)
    assert only(report, "absent")["message"] == f"{vm.key} is error in vclmgr but absent on sim-1"


def test_claims_of_reservations_and_parked_vms_are_not_orphans(sim_host, image, alice, admin_user, sync_jobs):
    vm = running_vm(image, alice, sync_jobs)
    services.park(vm.pk, "test", actor="test")
    SimVM.objects.filter(key=vm.key).update(state="stopped")
    start = timezone.now() + timedelta(days=1)
    future = Allocation.objects.create(
        host=sim_host,
        purpose="reservation 1",
        vcpus=1,
        memory_mib=256,
        disk_gib=1,
        start=start,
        end=start + timedelta(hours=1),
    )
    Reservation.objects.create(
        user=alice,
        image=image,
        start=start,
        end=start + timedelta(hours=1),
        status="pending",
        vcpus=1,
        memory_mib=256,
        disk_gib=1,
        allocation=future,
    )
    _, report = run_verify(sync_jobs, admin_user)
    assert report.findings == []
    Reservation.objects.update(status="canceled")  # its claim should have gone with it
    _, report = run_verify(sync_jobs, admin_user)
    assert only(report, "orphan_claim")["allocation"] == future.pk


def test_each_drift_on_libvirt_is_found(kvm_host, kvm_image, alice, admin_user, sync_jobs):  # noqa: F811
    gone, stopped = running_vm(kvm_image, alice, sync_jobs), running_vm(kvm_image, alice, sync_jobs)
    driver = drivers.driver_for(kvm_host)
    driver.destroy(gone.key)  # behind vclmgr's back
    driver.stop(stopped.key, force=True)
    driver.conn.defineXML(
        "<domain type='test'><name>someones-vm</name><memory>262144</memory><vcpu>1</vcpu>"
        "<os><type>hvm</type></os></domain>"
    )  # a VM someone made by hand
    job, report = run_verify(sync_jobs, admin_user)
    assert job.status == "error"
    assert only(report, "absent")["message"] == f"{gone.key} is running in vclmgr but absent on kvm-1"
    assert only(report, "drift")["message"] == f"{stopped.key} is running in vclmgr but stopped on kvm-1"
    foreign = only(report, "unknown")
    assert foreign["key"] == "someones-vm" and foreign["ours"] is False
    assert foreign["message"] == "someones-vm runs on kvm-1 (stopped); not a vclmgr name (made outside vclmgr?)"


def test_an_unreachable_libvirt_host_is_not_all_absent(kvm_host, kvm_image, alice, admin_user, sync_jobs):  # noqa: F811
    import socket

    from inventory.models import Hypervisor

    running_vm(kvm_image, alice, sync_jobs)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    uri = kvm_host.uri
    Hypervisor.objects.filter(pk=kvm_host.pk).update(uri=f"qemu+tcp://127.0.0.1:{closed}/system")
    try:
        _, report = run_verify(sync_jobs, admin_user)
    finally:
        Hypervisor.objects.filter(pk=kvm_host.pk).update(uri=uri)
    assert kinds(report) == ["unreachable"]


def test_releasing_an_orphan_claim(sim_host, image, alice, admin_user, sync_jobs):
    vm = running_vm(image, alice, sync_jobs)
    orphan = Allocation.objects.create(
        host=sim_host,
        purpose="vm 424242",
        vcpus=1,
        memory_mib=256,
        disk_gib=1,
        start=timezone.now(),
        end=timezone.now() + timedelta(hours=1),
    )
    with pytest.raises(Conflict, match="is held"):
        verify.release_orphan_claim(vm.allocation_id, actor=admin_user)
    verify.release_orphan_claim(orphan.pk, actor=admin_user)
    assert Allocation.objects.get(pk=orphan.pk).released is not None
    with pytest.raises(Conflict, match="released already"):
        verify.release_orphan_claim(orphan.pk, actor=admin_user)


def test_the_schedule_follows_the_setting_and_does_not_pile_up(db, admin_user):
    tasks.ensure_verify_schedule()
    assert Schedule.objects.get(name=tasks.VERIFY_SCHEDULE).minutes == 60
    tasks.ensure_verify_schedule(minutes=0)
    assert not Schedule.objects.filter(name=tasks.VERIFY_SCHEDULE).exists()
    first = tasks.submit_verify()
    assert first and tasks.submit_verify() is None
    assert Job.objects.get(pk=first).opcode == "cluster.verify"


def test_the_api_shows_runs_and_releases_for_staff_only(sim_host, image, alice, admin_user, api, sync_jobs):
    orphan = Allocation.objects.create(
        host=sim_host, purpose="vm 424242", vcpus=1, memory_mib=256, disk_gib=1, start=timezone.now()
    )
    assert api(admin_user).get("/api/v1/verify/").status_code == 404  # no report yet
    response = api(admin_user).post("/api/v1/verify/")
    assert response.status_code == 202, response.content
    sync_jobs.drain()
    assert Job.objects.get(pk=response.json()["job"]).opcode == "cluster.verify"
    body = api(admin_user).get("/api/v1/verify/").json()
    assert body["job_id"] == response.json()["job"]
    assert [f["kind"] for f in body["findings"]] == ["orphan_claim"]
    for call in (
        lambda c: c.get("/api/v1/verify/"),
        lambda c: c.post("/api/v1/verify/"),
        lambda c: c.post(f"/api/v1/verify/claims/{orphan.pk}/release/"),
    ):
        assert call(api(alice)).status_code in (403, 404)
    assert Job.objects.filter(opcode="cluster.verify").count() == 1  # alice's POST submitted nothing
    assert Allocation.objects.get(pk=orphan.pk).released is None
    assert api(admin_user).post(f"/api/v1/verify/claims/{orphan.pk}/release/").status_code == 200
    assert Allocation.objects.get(pk=orphan.pk).released is not None
    assert api(admin_user).post(f"/api/v1/verify/claims/{orphan.pk}/release/").status_code == 409


def test_the_page_lists_findings_for_staff_only(client, sim_host, image, alice, admin_user, sync_jobs):
    orphan = Allocation.objects.create(
        host=sim_host, purpose="vm 424242", vcpus=1, memory_mib=256, disk_gib=1, start=timezone.now()
    )
    client.force_login(alice)
    for response in (
        client.get("/vms/verify/"),
        client.post("/vms/verify/run/"),
        client.post(f"/vms/verify/claims/{orphan.pk}/release/"),
    ):
        assert response.status_code in (403, 404)
    assert not Job.objects.filter(opcode="cluster.verify").exists()
    client.force_login(admin_user)
    assert "No report yet" in client.get("/vms/verify/").content.decode()
    client.post("/vms/verify/run/")
    sync_jobs.drain()
    page = client.get("/vms/verify/").content.decode()
    assert f"claim {orphan.pk} on sim-1 (vm 424242) is held by no live VM or reservation" in page
    client.post(f"/vms/verify/claims/{orphan.pk}/release/")
    assert Allocation.objects.get(pk=orphan.pk).released is not None


def test_only_the_latest_reports_are_kept(db, monkeypatch):
    monkeypatch.setattr(verify, "KEEP_REPORTS", 2)
    made = [verify.run(actor="test").pk for _ in range(3)]
    assert list(VerifyReport.objects.values_list("pk", flat=True)) == made[:0:-1]
    assert verify.latest().pk == made[-1]
