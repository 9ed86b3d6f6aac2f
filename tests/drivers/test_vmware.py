"""The VMware driver against VMware's vSphere simulator (vcsim, built from Debian's govmomi)."""

import dataclasses

import pytest

from drivers.base import Conflict, DriverError, Invalid, NotFound, Unreachable, VMState

pytestmark = pytest.mark.slow  # starts vcsim (once per session and worker)


def vm_props(driver, key, paths):
    return driver._props(driver._vm(key), paths)


def test_facts_match_the_simulated_hosts(vcsim):
    for host in vcsim.hosts:
        facts = vcsim.driver(host["name"]).facts()

        assert (facts.name, facts.cpus, facts.memory_mib) == (host["name"], host["cpus"], host["memory_mib"])
        assert facts.hypervisor_type == "vmware" and "ESX" in facts.version
        assert facts.extra["datastore"] and facts.disk_gib > 0
    assert len({host["cpus"] for host in vcsim.hosts}) == len(vcsim.hosts)  # capacities really differ


def test_discover_lists_every_host_of_the_vcenter(vcsim):
    found = vcsim.driver(None).discover()

    assert sorted(f.name for f in found) == sorted(host["name"] for host in vcsim.hosts)
    assert {f.name: f.cpus for f in found} == {host["name"]: host["cpus"] for host in vcsim.hosts}


def test_a_vcenter_with_many_hosts_needs_one_named(vcsim):
    with pytest.raises(Invalid, match="name one") as caught:
        vcsim.driver(None).facts()
    assert caught.value.permanent

    with pytest.raises(NotFound, match="no host"):
        vcsim.driver("esx-that-is-not-there").facts()


def test_the_host_may_be_named_in_the_uri(vcsim):
    from drivers.vmware.driver import VMwareDriver

    name = vcsim.hosts[0]["name"]
    driver = VMwareDriver(f"{vcsim.url}?host={name}", vcsim.credentials)

    assert driver.facts().name == name


def test_bad_credentials_are_permanent(vcsim):
    from drivers.vmware.driver import VMwareDriver

    driver = VMwareDriver(vcsim.url, {"username": "vclmgr", "password": "wrong"}, {"host": vcsim.hosts[0]["name"]})

    with pytest.raises(Unreachable, match="InvalidLogin") as caught:
        driver.facts()

    assert caught.value.permanent


def test_a_vmdk_vm_gets_a_delta_disk_on_the_staged_base(vmware_peer):
    base_path = vmware_peer.source.stage_image(vmware_peer.image)
    spec = vmware_peer.spec(vcpus=4, memory_mib=4096, disk_gib=30)

    vmware_peer.source.create(spec)

    props = vm_props(vmware_peer.source, spec.key, ["config.hardware", "config.extraConfig", "runtime.host"])
    hardware = props["config.hardware"]
    assert (hardware.numCPU, hardware.memoryMB) == (4, 4096)
    from pyVmomi import vim

    disk = next(dev for dev in hardware.device if isinstance(dev, vim.vm.device.VirtualDisk))
    assert disk.backing.parent.fileName == base_path
    assert disk.capacityInKB == 30 * 1024 * 1024
    extra = {opt.key: opt.value for opt in props["config.extraConfig"]}
    assert extra["vclmgr.fingerprint"] == spec.fingerprint()
    assert props["runtime.host"].name == vmware_peer.source.host_name


def test_a_running_vm_with_hot_add_on_is_resized_at_once(vmware_peer):
    from pyVmomi import vim

    source = vmware_peer.source
    vmware_peer.source.stage_image(vmware_peer.image)
    spec = vmware_peer.spec(vcpus=2, memory_mib=1024)
    source.create(spec)
    hot_add = vim.vm.ConfigSpec(cpuHotAddEnabled=True, memoryHotAddEnabled=True)
    source._wait(source._vm(spec.key).ReconfigVM_Task(spec=hot_add), "enable hot-add")
    source.start(spec.key)

    assert source.resize(spec.key, 4, 2048) == "now"

    hardware = vm_props(source, spec.key, ["config.hardware"])["config.hardware"]
    assert (hardware.numCPU, hardware.memoryMB) == (4, 2048)
    source.suspend(spec.key)
    with pytest.raises(Conflict, match="suspended"):
        source.resize(spec.key, 4, 4096)


def test_staged_images_land_in_the_datastore_image_folder(vmware_peer):
    path = vmware_peer.source.stage_image(vmware_peer.image)

    assert path.startswith("[LocalDS_0] vclmgr-images/ubuntu-24.04-") and path.endswith(".vmdk")
    ds = vmware_peer.source._datastore()
    assert not vmware_peer.source._exists(ds, path.split("] ", 1)[1] + ".part")


def test_clone_from_a_template_lands_on_the_requested_host(vmware_peer):
    vmware_peer.source.stage_image(vmware_peer.image)
    golden = vmware_peer.spec()
    vmware_peer.source.create(golden)
    template = vmware_peer.source.capture(golden.key, f"golden-{golden.key}")
    assert vmware_peer.target.stage_image(template) == template.location
    spec = vmware_peer.spec(image=template, vcpus=3, memory_mib=3072)

    info = vmware_peer.target.create(spec)

    assert (info.host, info.vcpus, info.memory_mib) == (vmware_peer.target.host_name, 3, 3072)
    assert vmware_peer.target.create(spec) == info
    assert spec.key in [vm.key for vm in vmware_peer.target.list_vms()]


def test_a_missing_template_is_not_found(vmware_peer):
    image = dataclasses.replace(vmware_peer.image, format="template", location="no-such-template")

    with pytest.raises(NotFound, match="no-such-template"):
        vmware_peer.source.stage_image(image)


def test_capture_refuses_a_name_used_by_a_vm(vmware_peer):
    vmware_peer.source.stage_image(vmware_peer.image)
    first, second = vmware_peer.spec(), vmware_peer.spec()
    vmware_peer.source.create(first)
    vmware_peer.source.create(second)

    with pytest.raises(Conflict):
        vmware_peer.source.capture(first.key, second.key)


def test_destroy_refuses_to_delete_a_template(vmware_peer):
    vmware_peer.source.stage_image(vmware_peer.image)
    spec = vmware_peer.spec()
    vmware_peer.source.create(spec)
    key_like_template = vmware_peer.spec().key
    vmware_peer.source.capture(spec.key, key_like_template)

    with pytest.raises(Conflict, match="template"):
        vmware_peer.source.destroy(key_like_template)
    assert vmware_peer.source.state(key_like_template) == VMState.ERROR


def test_migrating_to_another_vcenter_is_refused(vmware_peer, vcsim):
    from drivers.vmware.driver import VMwareDriver

    elsewhere = VMwareDriver("https://other-vcenter.example.org/sdk", vcsim.credentials, {"host": "esx1"})

    with pytest.raises(Invalid, match="between vCenters"):
        vmware_peer.source.migrate("vcl-1", elsewhere)


def test_vms_of_other_hosts_are_not_listed(vmware_peer):
    vmware_peer.source.stage_image(vmware_peer.image)
    spec = vmware_peer.spec()
    vmware_peer.source.create(spec)

    assert spec.key in [vm.key for vm in vmware_peer.source.list_vms()]
    assert spec.key not in [vm.key for vm in vmware_peer.target.list_vms()]


# --- the guest command channel (vSphere guest operations) -----------------------------------
# Debian's vcsim runs guest operations only in a container (the VM's RUN.container, through
# the docker CLI); without one it answers GuestOperationsUnavailable to the file transfers, and
# its GuestProcessManager and the other GuestFileManager methods are not implemented at all.
# So these tests reach exactly that far: the calls, their arguments and the faults' messages.

GUEST = {"username": "vclmgr-svc", "password": "guest-secret-7f3a"}  # noqa: S105 (made up here)


def running_vm(peer, **guest):
    peer.source.stage_image(peer.image)
    spec = peer.spec()
    peer.source.create(spec)
    peer.source.start(spec.key)
    driver = type(peer.source)(peer.source.uri, {**peer.source.credentials, "guest": GUEST}, peer.source.options)
    return driver, spec.key


def test_file_transfers_without_guest_tools_say_that_tools_are_missing(vmware_peer):
    driver, key = running_vm(vmware_peer)

    for call in (
        lambda: driver.guest_put_file(key, "/tmp/vclmgr-run/in.txt", b"data"),
        lambda: driver.guest_get_file(key, "/tmp/vclmgr-run/out.xml", 1 << 20),
    ):
        with pytest.raises(DriverError, match=rf"VMware Tools on VM {key} do not offer guest operations") as caught:
            call()
        assert not caught.value.permanent  # Tools may still be starting: a retry may see them
        assert GUEST["password"] not in str(caught.value)


def test_process_and_listing_calls_vcsim_lacks_are_named(vmware_peer):
    driver, key = running_vm(vmware_peer)

    # A start first looks for the tag's directory (idempotence): ListFilesInGuest, which vcsim lacks.
    with pytest.raises(Invalid, match="does not implement the guest operation ListFilesInGuest"):
        driver.guest_exec(key, "run-1", ["make", "test"], {"CI": "1"}, "/tmp/vclmgr-run")
    with pytest.raises(Invalid, match="ListFilesInGuest"):
        driver.guest_glob(key, "/tmp/vclmgr-run", ["*.xml"])
    # The status reads its files first: the transfer is where vcsim stops.
    with pytest.raises(DriverError, match="do not offer guest operations"):
        driver.guest_exec_status(key, "run-1", 0)
    # A tag names a path in the guest: one that could leave the exec directory is refused.
    with pytest.raises(Invalid, match="bad exec tag"):
        driver.guest_exec_status(key, "../../etc", 0)


def test_guest_calls_on_vcsim_without_a_guest_login_are_refused(vmware_peer):
    vmware_peer.source.stage_image(vmware_peer.image)
    spec = vmware_peer.spec()
    vmware_peer.source.create(spec)
    vmware_peer.source.start(spec.key)

    with pytest.raises(Invalid, match="need a login in the guest, and its image has none"):
        vmware_peer.source.guest_put_file(spec.key, "/tmp/x", b"x")


def test_guest_calls_for_a_vm_that_is_not_there_are_not_found(vmware_peer):
    driver = type(vmware_peer.source)(
        vmware_peer.source.uri, {**vmware_peer.source.credentials, "guest": GUEST}, vmware_peer.source.options
    )

    with pytest.raises(NotFound, match="no VM vcl-999999"):
        driver.guest_exec_status("vcl-999999", "run-1", 0)
