"""The driver contract, run against every driver's real peer (sim, libvirt's test driver, vcsim).

See ``drivers/base.py`` for the contract itself.
"""

import dataclasses
import socket

import pytest

from drivers.base import (
    APPLIES_NEXT_BOOT,
    APPLIES_NOW,
    Conflict,
    DriverError,
    Invalid,
    NetworkSpec,
    NotFound,
    Unreachable,
    VMState,
)
from tests.drivers.conftest import next_key


def keys(driver):
    return [vm.key for vm in driver.list_vms()]


def staged(peer, **overrides):
    """A spec whose image is staged on the source host."""
    peer.source.stage_image(peer.image)
    return peer.spec(**overrides)


def closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_facts_are_sane(peer):
    facts = peer.source.facts()

    assert facts.name and facts.version
    assert facts.hypervisor_type == peer.source.hypervisor_type
    assert facts.cpus > 0 and facts.memory_mib > 0 and facts.disk_gib > 0
    assert facts.free_memory_mib is None or 0 <= facts.free_memory_mib <= facts.memory_mib
    assert facts.free_disk_gib is None or 0 <= facts.free_disk_gib <= facts.disk_gib
    assert 0 <= facts.running_vms <= facts.vms
    assert facts.as_dict()["cpus"] == facts.cpus


def test_facts_count_running_vms(peer):
    spec = staged(peer)
    before = peer.source.facts()
    peer.source.create(spec)
    peer.source.start(spec.key)

    after = peer.source.facts()

    assert (after.vms, after.running_vms) == (before.vms + 1, before.running_vms + 1)


def test_stage_image_twice_is_one_image(peer):
    first = peer.source.stage_image(peer.image)

    assert peer.source.stage_image(peer.image) == first


def test_unstage_removes_the_staged_copy_once(peer):
    location = peer.source.stage_image(peer.image)

    assert peer.source.unstage_image(location) is True
    assert peer.source.unstage_image(location) is False
    with pytest.raises(NotFound):
        peer.source.create(peer.spec())  # staged no more
    assert peer.source.stage_image(peer.image) == location  # and staged again where it was


def test_create_twice_makes_one_vm(peer):
    spec = staged(peer, vcpus=2, memory_mib=2048)

    first = peer.source.create(spec)
    second = peer.source.create(spec)

    assert first == second
    assert (first.key, first.state, first.vcpus, first.memory_mib) == (spec.key, VMState.STOPPED, 2, 2048)
    assert keys(peer.source).count(spec.key) == 1


def test_it_refuses_a_vm_name_taken_by_another_request(peer):
    spec = staged(peer)
    peer.source.create(spec)
    stranger = dataclasses.replace(spec, vcpus=spec.vcpus + 1)

    with pytest.raises(Conflict) as caught:
        peer.source.create(stranger)

    assert caught.value.permanent
    assert keys(peer.source).count(spec.key) == 1


def test_it_needs_the_image_staged_first(peer):
    spec = peer.spec()  # image never staged on this host

    with pytest.raises(NotFound) as caught:
        peer.source.create(spec)

    assert caught.value.permanent and "stage" in str(caught.value)
    assert spec.key not in keys(peer.source)


def test_it_rejects_an_image_whose_checksum_does_not_match(peer):
    bad = dataclasses.replace(peer.image, checksum="sha256:" + "0" * 64)

    with pytest.raises(Invalid) as caught:
        peer.source.stage_image(bad)

    assert caught.value.permanent and "checksum mismatch" in str(caught.value)
    with pytest.raises(NotFound):  # nothing was staged
        peer.source.create(peer.spec(image=bad))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"key": "bad name!"}, "VM key"),
        ({"vcpus": 0}, "vcpus"),
        ({"memory_mib": -1}, "memory_mib"),
        ({"network": "a b"}, "network"),
    ],
)
def test_invalid_requests_are_permanent(peer, change, message):
    spec = dataclasses.replace(staged(peer), **change)

    with pytest.raises(Invalid, match=message) as caught:
        peer.source.create(spec)

    assert caught.value.permanent


def test_it_refuses_image_formats_the_hypervisor_cannot_run(peer):
    foreign = {"sim": None, "libvirt": "vmdk", "vmware": "qcow2"}[peer.kind]
    if foreign is None:  # the simulator emulates every format
        image = dataclasses.replace(peer.image, format="vmdk")
        assert peer.source.stage_image(image)
        return
    image = dataclasses.replace(peer.image, format=foreign)

    with pytest.raises(Invalid, match=foreign) as caught:
        peer.source.stage_image(image)

    assert caught.value.permanent


def test_lifecycle_calls_can_be_repeated(peer):
    spec = staged(peer)
    source = peer.source
    source.create(spec)

    source.start(spec.key)
    source.start(spec.key)
    assert source.state(spec.key) == VMState.RUNNING
    assert source.address(spec.key)

    source.suspend(spec.key)
    source.suspend(spec.key)
    assert source.state(spec.key) == VMState.SUSPENDED
    assert source.address(spec.key) is None

    source.resume(spec.key)
    source.resume(spec.key)
    assert source.state(spec.key) == VMState.RUNNING

    source.stop(spec.key)
    source.stop(spec.key)
    assert source.state(spec.key) == VMState.STOPPED
    assert source.address(spec.key) is None

    source.start(spec.key)
    source.stop(spec.key, force=True)
    source.stop(spec.key, force=True)
    assert source.state(spec.key) == VMState.STOPPED


def test_destroy_twice_is_fine(peer):
    spec = staged(peer)
    peer.source.create(spec)
    peer.source.start(spec.key)

    peer.source.destroy(spec.key)
    peer.source.destroy(spec.key)

    assert peer.source.state(spec.key) == VMState.ABSENT
    assert spec.key not in keys(peer.source)


def test_snapshot_and_revert(peer):
    spec = staged(peer)
    source = peer.source
    source.create(spec)
    source.start(spec.key)

    source.snapshot(spec.key, "clean")
    source.snapshot(spec.key, "clean")
    source.stop(spec.key)
    source.revert(spec.key, "clean")
    source.revert(spec.key, "clean")

    # The state at snapshot time, or stopped where the driver cannot restore memory.
    assert source.state(spec.key) in (VMState.RUNNING, VMState.STOPPED)
    with pytest.raises(NotFound) as caught:
        source.revert(spec.key, "never-taken")
    assert caught.value.permanent


def test_calls_on_an_absent_vm(peer):
    key = peer.spec().key

    assert peer.source.state(key) == VMState.ABSENT
    peer.source.destroy(key)
    for call in (peer.source.start, peer.source.stop, peer.source.suspend, peer.source.resume, peer.source.address):
        with pytest.raises(NotFound) as caught:
            call(key)
        assert caught.value.permanent, call


def test_calls_in_the_wrong_state_are_conflicts(peer):
    spec = staged(peer)
    source = peer.source
    source.create(spec)

    for call in (source.suspend, source.resume):
        with pytest.raises(Conflict) as caught:
            call(spec.key)  # the VM is stopped
        assert caught.value.permanent
    source.start(spec.key)
    with pytest.raises(Conflict):
        source.capture(spec.key, f"img-{spec.key}")  # running
    source.suspend(spec.key)
    with pytest.raises(Conflict):
        source.stop(spec.key)  # a graceful stop cannot reach a suspended guest
    source.stop(spec.key, force=True)
    assert source.state(spec.key) == VMState.STOPPED


def size(driver, key):
    info = next(vm for vm in driver.list_vms() if vm.key == key)
    return info.vcpus, info.memory_mib


def test_resize_gives_a_stopped_vm_its_new_size(peer):
    spec = staged(peer, vcpus=2, memory_mib=1024)
    source = peer.source
    source.create(spec)

    assert source.resize(spec.key, 3, 2048) == APPLIES_NOW
    assert source.resize(spec.key, 3, 2048) == APPLIES_NOW
    assert size(source, spec.key) == (3, 2048)
    source.start(spec.key)
    assert size(source, spec.key) == (3, 2048)
    assert source.resize(spec.key, 3, 2048) in (APPLIES_NOW, APPLIES_NEXT_BOOT)  # nothing to change


def test_a_running_vm_gets_its_new_size_when_it_next_boots(peer):
    spec = staged(peer, vcpus=2, memory_mib=1024)
    source = peer.source
    source.create(spec)
    source.start(spec.key)

    if peer.kind == "vmware":  # no definition apart from the running VM, and vcsim's VMs have hot-add off
        with pytest.raises(Conflict, match="hot-add"):
            source.resize(spec.key, 3, 2048)
        assert size(source, spec.key) == (2, 1024)
        return
    assert source.resize(spec.key, 3, 2048) == APPLIES_NEXT_BOOT
    source.stop(spec.key, force=True)
    source.start(spec.key)
    assert size(source, spec.key) == (3, 2048)


def test_resize_refuses_a_size_no_vm_may_have_and_an_absent_vm(peer):
    spec = staged(peer)
    peer.source.create(spec)

    for vcpus, memory_mib in ((0, 1024), (2, 8), (True, 1024), (2, "1024")):
        with pytest.raises(Invalid) as caught:
            peer.source.resize(spec.key, vcpus, memory_mib)
        assert caught.value.permanent
    with pytest.raises(NotFound) as caught:
        peer.source.resize(peer.spec().key, 2, 1024)
    assert caught.value.permanent


def login(instance_id, password="first-pw-123"):
    from drivers import cloudinit

    return cloudinit.GuestLogin(
        instance_id=instance_id, hostname="vcl-guest", login="alice", password_hash=cloudinit.password_hash(password)
    )


def test_reseed_gives_a_stopped_vm_its_next_users_seed(peer):
    spec = staged(peer, guest=login("i-1"))
    peer.source.create(spec)
    peer.source.start(spec.key)
    with pytest.raises(Conflict, match="stop it first"):
        peer.source.reseed(spec.key, login("i-2"))
    peer.source.stop(spec.key, force=True)

    nextone = login("i-2", "next-pw-456")
    peer.source.reseed(spec.key, nextone)
    peer.source.reseed(spec.key, nextone)  # a retried reseed
    with pytest.raises(Invalid, match="keeps instance id"):
        peer.source.reseed(spec.key, login("i-2", "other-pw-789"))
    peer.source.reseed(spec.key, None)
    peer.source.reseed(spec.key, None)
    peer.source.start(spec.key)  # a VM without a seed still boots
    assert peer.source.state(spec.key) == VMState.RUNNING
    with pytest.raises(NotFound):
        peer.source.reseed("vcl-absent-1", None)


def test_migrate_moves_the_vm(peer):
    spec = staged(peer)
    peer.target.stage_image(peer.image)
    peer.source.create(spec)
    peer.source.start(spec.key)

    peer.source.migrate(spec.key, peer.target)
    peer.source.migrate(spec.key, peer.target)

    assert spec.key in keys(peer.target)
    assert spec.key not in keys(peer.source)
    assert peer.target.state(spec.key) == VMState.RUNNING
    assert peer.target.address(spec.key)


def test_a_suspended_vm_moves_suspended(peer):
    """Every driver moves a suspended VM with its state (``moves_suspended``; libvirt's not from
    shared storage, where a suspended run resumes where it is)."""
    assert peer.source.moves_suspended
    spec = staged(peer)
    peer.target.stage_image(peer.image)
    peer.source.create(spec)
    peer.source.start(spec.key)
    peer.source.suspend(spec.key)

    peer.source.migrate(spec.key, peer.target)
    peer.source.migrate(spec.key, peer.target)

    assert spec.key in keys(peer.target) and spec.key not in keys(peer.source)
    assert peer.target.state(spec.key) == VMState.SUSPENDED
    peer.target.resume(spec.key)
    assert peer.target.state(spec.key) == VMState.RUNNING


def test_migrate_of_an_absent_vm_is_not_found(peer):
    with pytest.raises(NotFound):
        peer.source.migrate(peer.spec().key, peer.target)


def test_capture_makes_an_image_new_vms_boot_from(peer):
    spec = staged(peer)
    peer.source.create(spec)
    name = f"derived-{spec.key}"

    image = peer.source.capture(spec.key, name)

    assert peer.source.capture(spec.key, name) == image
    assert image.name == name and image.location
    peer.source.stage_image(image)
    child = peer.spec(image=image)
    peer.source.create(child)
    peer.source.start(child.key)
    assert peer.source.state(child.key) == VMState.RUNNING


def test_an_unreachable_host_is_a_temporary_error(peer, request):
    driver = unreachable_driver(peer, request)

    with pytest.raises(Unreachable) as caught:
        driver.facts()

    assert caught.value.permanent is False
    assert isinstance(caught.value, DriverError)


def unreachable_driver(peer, request):
    port = closed_port()
    if peer.kind == "sim":
        from drivers.sim import services

        services.set_fault("sim-a", "*", "unreachable")
        return peer.source
    if peer.kind == "libvirt":
        from drivers.libvirt.driver import LibvirtDriver

        return LibvirtDriver(f"qemu+tcp://127.0.0.1:{port}/system")
    vcsim = request.getfixturevalue("vcsim")
    return type(peer.source)(f"http://127.0.0.1:{port}/sdk", vcsim.credentials, {"host": "any"})


def test_guest_sessions_are_listed_where_the_hypervisor_can_tell(peer):
    """The simulator reports the sessions it was given; libvirt's test driver has no guest agent
    and vcsim's VMware Tools report no logins: both say so permanently (``Invalid``), so idle
    reclamation is not applied rather than guessing. (The QEMU guest agent's real answer is
    tested on a real VM: tests/integration/test_idle_real_vm.py.)"""
    spec = staged(peer)
    source = peer.source
    source.create(spec)
    if source.kind == "sim":
        with pytest.raises(Conflict):
            source.guest_sessions(spec.key)  # stopped: nobody can be logged in
    source.start(spec.key)
    if source.kind != "sim":
        with pytest.raises(Invalid) as caught:
            source.guest_sessions(spec.key)
        assert caught.value.permanent
        return
    from drivers.sim import services as sim

    assert source.guest_sessions(spec.key) == []
    sim.set_sessions(spec.key, [{"user": "alice", "login_time": 1.5e9, "idle_seconds": 30}], actor="test")
    [session] = source.guest_sessions(spec.key)
    assert (session.user, session.login_time, session.idle_seconds) == ("alice", 1.5e9, 30)
    source.stop(spec.key, force=True)
    source.start(spec.key)
    assert source.guest_sessions(spec.key) == []  # a reboot logs everybody out


def test_personalise_hands_a_running_guest_its_user_where_the_driver_can(peer):
    """A warm VM's hand-over: the simulator makes the guest's identity anew each time; libvirt's
    test driver has no guest agent, a temporary error (the warm start then builds the VM cold;
    the real agent's answer: tests/integration/test_warm_pool_real_vm.py); VMware cannot, a
    permanent ``Invalid``. A VM that is not running is a ``Conflict``."""
    spec = staged(peer)
    source = peer.source
    source.create(spec)
    if source.kind == "vmware":
        with pytest.raises(Invalid):
            source.personalise(spec.key, login("i-1"))
        return
    with pytest.raises(Conflict):
        source.personalise(spec.key, login("i-1"))  # stopped
    source.start(spec.key)
    if source.kind != "sim":
        with pytest.raises(DriverError) as caught:
            source.personalise(spec.key, login("i-1"))
        assert not caught.value.permanent
        return
    from drivers.sim.models import SimVM

    source.personalise(spec.key, login("i-1"))
    first = SimVM.objects.get(key=spec.key).guest["identity"]
    source.personalise(spec.key, login("i-1"))  # a retried step: the same login, a new identity
    again = SimVM.objects.get(key=spec.key).guest["identity"]
    assert again["hostname"] == first["hostname"] == "vcl-guest"
    assert again["host_key"] != first["host_key"] and again["machine_id"] != first["machine_id"]


# --- private networks (every driver that makes them) ---------------------------------------


@pytest.fixture
def lan(peer):
    """A private network spec whose key is unique in the session; deleted from both hosts after."""
    if not peer.source.supports_networks:
        pytest.fail(f"{peer.kind} makes no private networks: give it a peer without this suite")
    key = f"env-{next_key()}-lan"
    yield NetworkSpec(key, "10.201.0.0/24", (("router", peer.source.private_mac("vcl-1", key)),))
    peer.cleanup()
    for driver in (peer.source, peer.target):
        driver.delete_network(key)


def member(peer, spec, *networks):
    # Each driver's MAC: VMware takes static MACs only in a range of its own.
    mac = peer.source.private_mac
    return dataclasses.replace(spec, private_networks=tuple((net, mac(spec.key, net)) for net in networks))


def test_create_network_twice_makes_one_and_list_shows_it(peer, lan):
    first = peer.source.create_network(lan)

    assert first == peer.source.create_network(lan)
    assert (first.key, first.cidr, first.managed) == (lan.key, "10.201.0.0/24", True)
    assert [n.key for n in peer.source.list_networks()].count(lan.key) == 1
    assert lan.key not in [n.key for n in peer.target.list_networks()]


def test_another_network_spec_under_the_same_key_is_a_conflict(peer, lan):
    peer.source.create_network(lan)

    with pytest.raises(Conflict) as caught:
        peer.source.create_network(dataclasses.replace(lan, hosts=()))

    assert caught.value.permanent


def test_delete_network_says_whether_there_was_one(peer, lan):
    peer.source.create_network(lan)

    assert peer.source.delete_network(lan.key) is True
    assert peer.source.delete_network(lan.key) is False
    assert lan.key not in [n.key for n in peer.source.list_networks()]


def test_an_invalid_network_is_refused_permanently(peer):
    with pytest.raises(Invalid, match="private range") as caught:
        peer.source.create_network(NetworkSpec("env-public", "8.8.8.0/24"))

    assert caught.value.permanent and "env-public" not in [n.key for n in peer.source.list_networks()]


def test_a_member_needs_its_network_on_its_host_and_holds_it(peer, lan):
    spec = member(peer, staged(peer), lan.key)
    with pytest.raises(NotFound) as caught:
        peer.source.create(spec)
    assert caught.value.permanent and spec.key not in keys(peer.source)

    peer.source.create_network(lan)
    info = peer.source.create(spec)

    assert info == peer.source.create(spec)  # a retry
    with pytest.raises(Conflict, match="still used"):
        peer.source.delete_network(lan.key)
    peer.source.destroy(spec.key)
    assert peer.source.delete_network(lan.key) is True


def test_private_nics_are_part_of_the_fingerprint(peer, lan):
    peer.source.create_network(lan)
    spec = staged(peer)
    peer.source.create(spec)

    with pytest.raises(Conflict):
        peer.source.create(member(peer, spec, lan.key))


def test_a_member_does_not_move_to_a_host_without_its_network(peer, lan):
    peer.source.create_network(lan)
    spec = member(peer, staged(peer), lan.key)
    peer.source.create(spec)

    with pytest.raises(Conflict, match="share a host") as caught:
        peer.source.migrate(spec.key, peer.target)

    assert caught.value.permanent and spec.key in keys(peer.source)
