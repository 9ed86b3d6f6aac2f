"""The simulated hypervisor: fault injection, delays, DHCP, state shared between processes."""

import dataclasses
import threading
import time

import pytest
from django.core.exceptions import ValidationError

from core.models import ObjectChange
from drivers.base import Conflict, DriverError, Unreachable, VMState
from drivers.sim import services
from drivers.sim.driver import SimDriver
from drivers.sim.models import SimFault, SimHost, SimVM
from tests import processes

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(sim_peer):
    """A running VM on sim-a."""
    sim_peer.source.stage_image(sim_peer.image)
    spec = sim_peer.spec()
    sim_peer.source.create(spec)
    sim_peer.source.start(spec.key)
    return spec.key


def test_it_creates_hosts_on_first_use_with_the_given_capacity(sim_peer):
    facts = sim_peer.target.facts()

    assert (facts.name, facts.cpus, facts.memory_mib, facts.disk_gib) == ("sim-b", 32, 131072, 2000)
    assert SimHost.objects.filter(name="sim-b").exists()


def test_free_memory_counts_running_vms(sim_peer, running):
    facts = sim_peer.source.facts()

    assert facts.free_memory_mib == 16384 - 1024
    assert facts.running_vms == 1


def test_a_fail_fault_fails_every_call_permanently(sim_peer, running):
    services.set_fault("sim-a", "stop", "fail")

    for _ in range(2):
        with pytest.raises(DriverError, match="injected failure") as caught:
            sim_peer.source.stop(running)
        assert caught.value.permanent
    assert sim_peer.source.state(running) == VMState.RUNNING  # nothing happened


def test_a_fail_once_fault_fails_once_then_succeeds(sim_peer, running):
    services.set_fault("sim-a", "stop", "fail_once")

    with pytest.raises(DriverError, match="one-time") as caught:
        sim_peer.source.stop(running)

    assert caught.value.permanent is False
    sim_peer.source.stop(running)
    assert sim_peer.source.state(running) == VMState.STOPPED
    assert not SimFault.objects.exists()


def test_a_slow_fault_delays_the_call(sim_peer, running):
    services.set_fault("sim-a", "suspend", "slow", seconds=0.3)

    started = time.monotonic()
    sim_peer.source.suspend(running)

    assert time.monotonic() - started >= 0.3
    assert sim_peer.source.state(running) == VMState.SUSPENDED


def test_a_hang_fault_ends_as_unreachable(sim_peer, running):
    services.set_fault("sim-a", "address", "hang", seconds=0.3)

    started = time.monotonic()
    with pytest.raises(Unreachable, match="did not answer") as caught:
        sim_peer.source.address(running)

    assert time.monotonic() - started >= 0.3
    assert caught.value.permanent is False


def test_an_unreachable_fault_is_temporary(sim_peer):
    services.set_fault("sim-b", "facts", "unreachable")

    with pytest.raises(Unreachable) as caught:
        sim_peer.target.facts()

    assert caught.value.permanent is False
    assert sim_peer.source.facts().name == "sim-a"  # other hosts unaffected


def test_a_fault_on_every_step_yields_to_one_on_the_step(sim_peer, running):
    services.set_fault("sim-a", "*", "fail")
    services.set_fault("sim-a", "state", "slow", seconds=0)

    assert sim_peer.source.state(running) == VMState.RUNNING
    with pytest.raises(DriverError):
        sim_peer.source.stop(running)
    services.clear_fault("sim-a")
    sim_peer.source.stop(running)


def test_set_fault_replaces_and_records_who_and_why(sim_peer, admin_user):
    services.set_fault("sim-a", "create", "fail", actor=admin_user, reason="demo of a failed boot")
    services.set_fault("sim-a", "create", "slow", seconds=2, actor=admin_user)

    fault = SimFault.objects.get()
    assert (fault.step, fault.mode, fault.seconds) == ("create", "slow", 2)
    change = ObjectChange.objects.filter(object_repr="sim-a", reason="demo of a failed boot").get()
    assert change.user == admin_user


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("boot", "fail"), "step"),
        (("create", "explode"), "mode"),
        (("create", "slow"), "seconds"),
        (("create", "slow", -1), "seconds"),
    ],
)
def test_set_fault_rejects_bad_input(sim_peer, args, field):
    with pytest.raises(ValidationError) as caught:
        services.set_fault("sim-a", *args)

    assert field in caught.value.message_dict
    assert not SimFault.objects.exists()


def test_step_delays_come_from_the_options(db):
    driver = SimDriver("sim://slow-host", options={"delay": {"facts": 0.2}})

    started = time.monotonic()
    driver.facts()
    assert time.monotonic() - started >= 0.2
    started = time.monotonic()
    driver.list_vms()
    assert time.monotonic() - started < 0.2


def test_addresses_are_unique_and_kept_until_destroy(sim_peer, running):
    second = sim_peer.spec()
    sim_peer.target.stage_image(sim_peer.image)
    sim_peer.target.create(second)
    sim_peer.target.start(second.key)
    first_address = sim_peer.source.address(running)

    assert first_address.startswith("10.77.")
    assert sim_peer.target.address(second.key) != first_address
    sim_peer.source.stop(running)
    sim_peer.source.start(running)
    assert sim_peer.source.address(running) == first_address
    sim_peer.source.destroy(running)
    assert not SimVM.objects.filter(address=first_address).exists()


def test_an_exhausted_pool_is_a_conflict(db, tmp_path, sim_peer):
    driver = SimDriver("sim://tiny", options={"dhcp_pool": "192.168.77.0/30"})  # one lease: .2
    driver.stage_image(sim_peer.image)
    first, second = sim_peer.spec(), sim_peer.spec()
    for spec in (first, second):
        driver.create(spec)
    driver.start(first.key)

    with pytest.raises(Conflict, match="exhausted"):
        driver.start(second.key)

    assert driver.address(first.key) == "192.168.77.2"


def test_migrating_to_another_pool_takes_a_new_address(sim_peer, running):
    services.ensure_host("sim-b", dhcp_pool="10.78.0.0/16")
    sim_peer.target.stage_image(sim_peer.image)

    sim_peer.source.migrate(running, sim_peer.target)

    assert sim_peer.target.address(running).startswith("10.78.")


def test_a_running_vm_keeps_its_snapshot_state(sim_peer, running):
    sim_peer.source.snapshot(running, "booted")
    sim_peer.source.stop(running)

    sim_peer.source.revert(running, "booted")

    assert sim_peer.source.state(running) == VMState.RUNNING
    assert SimVM.objects.get(key=running).snapshots[0]["name"] == "booted"


def test_the_admin_injects_faults_through_the_service(admin_client, sim_peer):
    sim_peer.source.facts()
    host = SimHost.objects.get(name="sim-a")

    response = admin_client.post(
        "/admin/simhv/simfault/add/", {"host": host.pk, "step": "start", "mode": "slow", "seconds": "1.5"}
    )

    assert response.status_code == 302, response.content[:2000]
    assert SimFault.objects.get().seconds == 1.5
    assert ObjectChange.objects.filter(object_repr="sim-a", reason="admin").exists()
    assert admin_client.get("/admin/simhv/simhost/").status_code == 200
    assert admin_client.get(f"/admin/simhv/simhost/{host.pk}/change/").status_code == 200


def test_the_admin_refuses_a_slow_fault_without_seconds(admin_client, sim_peer):
    sim_peer.source.facts()
    host = SimHost.objects.get(name="sim-a")

    response = admin_client.post("/admin/simhv/simfault/add/", {"host": host.pk, "step": "start", "mode": "slow"})

    assert response.status_code == 200
    assert b"needs seconds" in response.content
    assert not SimFault.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_hang_ends_when_the_fault_is_cleared_elsewhere(sim_peer, running):
    services.set_fault("sim-a", "stop", "hang", seconds=30)
    threading.Timer(0.3, services.clear_fault, args=("sim-a", "stop")).start()

    started = time.monotonic()
    sim_peer.source.stop(running)

    assert time.monotonic() - started < 10
    assert sim_peer.source.state(running) == VMState.STOPPED


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_another_process_sees_the_same_hosts_and_vms(sim_peer, running):
    address = sim_peer.source.address(running)
    services.set_fault("sim-a", "start", "fail_once")
    code = (
        "import django; django.setup()\n"
        "from drivers.sim.driver import SimDriver\n"
        "d = SimDriver('sim://sim-a')\n"
        f"print(d.state('{running}'), d.address('{running}'))\n"
        f"d.stop('{running}')\n"
        "try:\n"
        f"    d.start('{running}')\n"
        "except Exception as exc:\n"
        "    print('failed once:', exc.permanent)\n"
    )
    child = processes.run_python(code)

    assert child.returncode == 0, child.stderr
    assert child.stdout.splitlines() == [f"running {address}", "failed once: False"]
    assert sim_peer.source.state(running) == VMState.STOPPED  # the other process stopped it
    sim_peer.source.start(running)  # and used up the one-time fault


@pytest.mark.django_db(transaction=True)
def test_concurrent_calls_never_make_two_vms_or_share_an_address(sim_peer):
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection

    sim_peer.source.stage_image(sim_peer.image)
    same = sim_peer.spec()
    others = [sim_peer.spec() for _ in range(6)]

    def boot(spec):
        try:
            driver = SimDriver("sim://sim-a")  # as another worker would: its own driver and connection
            driver.create(spec)
            driver.start(spec.key)
            return driver.address(spec.key)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=4) as pool:
        addresses = list(pool.map(boot, [same, same, same, *others]))

    assert SimVM.objects.filter(key=same.key).count() == 1
    assert len(set(addresses)) == 1 + len(others)


def test_an_image_that_boots_its_kernel_is_staged_and_run_with_its_disk(sim_peer, tmp_path):
    kernel = tmp_path / "vmlinux"
    kernel.write_bytes(b"kernel\n")
    image = dataclasses.replace(sim_peer.image, checksum="", kernel=str(kernel), kernel_args="console=ttyS0")
    sim_peer.source.stage_image(image)
    spec = sim_peer.spec(image=image)

    sim_peer.source.create(spec)
    sim_peer.source.start(spec.key)

    assert sim_peer.source.state(spec.key) == VMState.RUNNING  # the simulator boots no kernel: it accepts one
