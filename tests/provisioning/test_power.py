"""Host power jobs against OpenStack's Redfish emulator (sushy-emulator, fake driver, HTTPS).

The emulator applies a reset 1–11 s after it is asked, like hardware, so each power change
here takes that long; the hosts are simulated hypervisors whose BMC is the emulator.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from capacity import services as capacity
from inventory import services as inventory
from inventory.models import Hypervisor
from jobs import services as jobs
from jobs.models import Job
from provisioning import services as vms
from reservations import services as reservations
from tests import redfish


@pytest.fixture(autouse=True)
def _short_waits(settings):
    settings.VCLMGR_BMC_TIMEOUT = 2
    settings.VCLMGR_BMC_GRACEFUL_SECONDS = 30  # the emulator takes up to 11 s
    settings.VCLMGR_BMC_POWER_SECONDS = 30


def run(sync_jobs, opcode, params, actor="test"):
    job = jobs.submit(opcode, params, actor=actor)
    sync_jobs.drain()
    job.refresh_from_db()
    return job


def off_host(host, emulator, sync_jobs):
    job = run(sync_jobs, "node.power_off", {"node": host.name, "reason": "plan 7"})
    assert job.status == "success", job.error_message
    return job


def test_power_off_then_on_through_the_bmc(make_host, redfish_bmc, bmc_host, sync_jobs, admin_user):
    emulator = redfish_bmc({"node-1": "on"})
    host = bmc_host(make_host("node-1"), emulator, "node-1")

    job = off_host(host, emulator, sync_jobs)
    assert emulator.power_state("node-1") == "Off"
    host.refresh_from_db()
    assert (host.state, host.power_state, host.power_standby) == ("offline", "off", True)
    assert host.state_reason == f"powered off by job {job.pk}: plan 7"
    assert job.result["how"] == "graceful shutdown"

    job = run(sync_jobs, "node.power_on", {"node": "NODE-1", "reason": "demand"}, actor=admin_user)
    assert job.status == "success", job.error_message
    assert emulator.power_state("node-1") == "On"
    host.refresh_from_db()
    assert (host.state, host.power_state, host.power_standby) == ("online", "on", False)
    assert host.state_reason == f"powered on by admin (job {job.pk}): demand"
    assert host.facts["reachable"] is True  # it went online only once its hypervisor answered
    assert [s["name"] for s in job.steps] == ["power-on", "hypervisor", "hypervisor-1", "online"]


def test_a_host_that_does_not_shut_down_in_time_is_forced_off(make_host, redfish_bmc, bmc_host, sync_jobs, settings):
    settings.VCLMGR_BMC_GRACEFUL_SECONDS = 0  # the emulator never shuts down that fast
    emulator = redfish_bmc({"node-1": "on"}, min_delay=3)
    host = bmc_host(make_host("node-1"), emulator, "node-1")
    job = off_host(host, emulator, sync_jobs)
    assert job.result["how"] == "forced off after the graceful shutdown timed out"
    assert emulator.power_state("node-1") == "Off"
    host.refresh_from_db()
    assert (host.state, host.power_state, host.power_standby) == ("offline", "off", True)


def test_it_refuses_to_power_off_a_host_with_vms_or_claims(make_host, redfish_bmc, bmc_host, sync_jobs, image):
    emulator = redfish_bmc({"node-1": "on"})
    host = bmc_host(make_host("node-1"), emulator, "node-1")
    later = timezone.now() + timedelta(days=1)
    demand = vms.demand_for(image, vms.size_for(image), start=later, end=later + timedelta(hours=2), purpose="future")
    capacity.claim_on_host(host, demand, actor="test")

    job = run(sync_jobs, "node.power_off", {"node": "node-1", "reason": "squeeze"})
    assert job.status == "error"
    assert "cannot power off node-1: 1 live allocation (VMs or reservations)" in job.error_message
    host.refresh_from_db()
    assert (host.state, host.power_standby) == ("online", False)
    assert emulator.power_state("node-1") == "On"


@pytest.mark.parametrize("fault", ["wrong password", "closed port", "silent port", "untrusted certificate"])
def test_a_bmc_that_refuses_or_does_not_answer_changes_nothing(fault, make_host, redfish_bmc, bmc_host, sync_jobs):
    emulator = redfish_bmc({"node-1": "on"})
    host = make_host("node-1")
    silent = redfish.SilentPort()
    try:
        if fault == "wrong password":
            bmc_host(host, emulator, "node-1", password="not-it")  # noqa: S106
        elif fault == "untrusted certificate":
            bmc_host(host, emulator, "node-1", bmc_verify_tls=True)
        else:
            port = redfish.free_port() if fault == "closed port" else silent.port
            bmc_host(host, emulator, "node-1", bmc_address=f"https://127.0.0.1:{port}")
        for opcode in ("node.power_off", "node.power_on"):
            job = run(sync_jobs, opcode, {"node": "node-1", "reason": "test"})
            assert job.status == "error"
            expected = {
                "wrong password": "the BMC refused the credential (HTTP 401)",
                "closed port": "no answer (connection refused)",
                "silent port": "no answer (timed out after 2 s)",
                "untrusted certificate": "its TLS certificate is not trusted",
            }[fault]
            assert expected in job.error_message
            assert redfish.PASSWORD not in job.error_message and "not-it" not in job.error_message
            host.refresh_from_db()
            assert (host.state, host.state_reason, host.power_standby) == ("online", "", False)
    finally:
        silent.close()
    assert emulator.power_state("node-1") == "On"


def test_a_host_that_never_answers_after_power_on_fails_in_slices(
    make_host, redfish_bmc, bmc_host, sync_jobs, settings, monkeypatch
):
    """The wait is cut into steps (a task may hand the job off between them), so a boot
    longer than a task's time slice still ends with the boot limit's error, not a timeout."""
    from drivers.sim import services as sim
    from provisioning.opcodes import power as power_ops

    monkeypatch.setattr(power_ops, "WAIT_SLICE_SECONDS", 0.5)
    monkeypatch.setattr(power_ops, "POLL_SECONDS", 0.2)
    settings.VCLMGR_POWER_ON_BOOT_SECONDS = 2
    emulator = redfish_bmc({"node-1": "on"})
    host = bmc_host(make_host("node-1"), emulator, "node-1")
    off_host(host, emulator, sync_jobs)
    sim.set_fault("node-1", "*", "unreachable")

    job = run(sync_jobs, "node.power_on", {"node": "node-1", "reason": "demand"})
    assert job.status == "error"
    assert "node-1: powered on, but its hypervisor did not answer within 2 s" in job.error_message
    slices = [s["name"] for s in job.steps if s["name"].startswith("hypervisor-")]
    assert len(slices) >= 2 and all(
        s["result"] == {"reachable": False, "waited_s": s["result"]["waited_s"]}
        for s in job.steps
        if s["name"] in slices
    )
    host.refresh_from_db()
    assert host.state == "offline"  # never put back online


def test_only_staff_submit_power_jobs(api, alice, admin_user, make_host, sync_jobs):
    make_host("node-1")
    payload = {"opcode": "node.power_off", "params": {"node": "node-1", "reason": "x"}}
    response = api(alice).post("/api/v1/jobs/", payload, format="json")
    assert response.status_code == 403
    assert not Job.objects.exists()
    response = api(admin_user).post(
        "/api/v1/jobs/", {**payload, "params": {"node": "nope", "reason": "x"}}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["params.node"] == ["no host named 'nope'"]


def test_a_reservation_that_fits_only_on_a_powered_off_host_powers_it_on(
    make_host, redfish_bmc, bmc_host, sync_jobs, image, alice
):
    emulator = redfish_bmc({"node-1": "on", "node-2": "on"})
    small = bmc_host(make_host("node-1", cpus=1, memory_mib=1024, disk_gib=10), emulator, "node-1")
    big = bmc_host(make_host("node-2"), emulator, "node-2")
    off_host(big, emulator, sync_jobs)
    assert emulator.power_state("node-2") == "Off"

    start = timezone.now()
    fit = reservations.check_fit(image, start, start + timedelta(hours=1), memory_mib=2048)
    assert fit.fits and fit.message == "fits after powering on host node-2"
    reservation = reservations.reserve(
        alice, image, start=start, end=start + timedelta(hours=1), size={"memory_mib": 2048}, actor=alice
    )
    assert reservation.allocation.host_id == big.pk
    wake = Job.objects.get(opcode="node.power_on")
    assert wake.params["node"] == "node-2"
    assert small.allocations.count() == 0
    sync_jobs.drain()
    wake.refresh_from_db()
    assert wake.status == "success", wake.error_message
    assert emulator.power_state("node-2") == "On"
    big.refresh_from_db()
    assert (big.state, big.power_standby) == ("online", False)
    reservation.refresh_from_db()
    assert reservation.status == "ready", reservation.error
    vm = reservation.vm
    assert vm is not None and vm.host_id == big.pk and vm.state == "running"


def test_an_ad_hoc_vm_waits_for_the_host_powered_on_for_it(make_host, redfish_bmc, bmc_host, sync_jobs, image, alice):
    emulator = redfish_bmc({"node-2": "off"})
    big = make_host("node-2")
    bmc_host(big, emulator, "node-2")
    Hypervisor.objects.filter(pk=big.pk).update(
        state="offline", state_reason="powered off by test: idle", power_standby=True, power_state="off"
    )
    vm, _ = vms.request_vm(owner=alice, image=image, actor=alice)
    sync_jobs.drain()
    vm.refresh_from_db()
    assert vm.state == "running" and vm.host_id == big.pk
    parent, child = Job.objects.filter(opcode="vm.create").order_by("pk")
    wake = Job.objects.get(opcode="node.power_on")
    assert parent.status == child.status == wake.status == "success", (parent.error_message, child.error_message)
    assert parent.result["result"]["after_power_on"] == wake.pk and child.parent_id == parent.pk
    assert child.started >= wake.ended  # it waited for the power-on, holding no worker meanwhile
    assert emulator.power_state("node-2") == "On"


def test_powering_on_keeps_an_administrators_offline(make_host, redfish_bmc, bmc_host, sync_jobs):
    emulator = redfish_bmc({"node-1": "on"})
    host = bmc_host(make_host("node-1"), emulator, "node-1")
    inventory.set_state(host, "offline", "broken PSU", actor="test")
    job = run(sync_jobs, "node.power_on", {"node": "node-1", "reason": "check"})
    assert job.status == "success" and job.result["how"] == "already on"
    host.refresh_from_db()
    assert (host.state, host.state_reason, host.power_state) == ("offline", "broken PSU", "on")


@pytest.mark.slow
def test_a_worker_powers_a_host_off_submitted_through_the_api(worker, redfish_bmc, bmc_host, api, django_user_model):
    from tests.jobs.helpers import wait_until

    admin = django_user_model.objects.create_user("root", "root@example.org", "root-pass-1", is_staff=True)
    emulator = redfish_bmc({"node-w": "on"})
    host = Hypervisor.objects.create(
        name="node-w", address="node-w.example.org", driver="sim", cpus=8, memory_mib=16384, disk_gib=200
    )
    bmc_host(host, emulator, "node-w")
    payload = {"opcode": "node.power_off", "params": {"node": "node-w", "reason": "plan 3"}}
    response = api(admin).post("/api/v1/jobs/", payload, format="json")
    assert response.status_code == 202, response.json()
    job_id = response.json()["id"]
    wait_until(lambda: Job.objects.get(pk=job_id).is_final, 60, "node.power_off to end", worker)
    job = Job.objects.get(pk=job_id)
    assert job.status == "success", job.error_message
    assert emulator.power_state("node-w") == "Off"
    host.refresh_from_db()
    assert host.state == "offline" and host.state_reason == f"powered off by root (job {job_id}): plan 3"
