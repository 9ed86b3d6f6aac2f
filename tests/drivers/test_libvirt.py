"""The libvirt driver against libvirt's own test driver (node files in tests/data/libvirt)."""

import dataclasses
import functools
import hashlib
import http.server
import threading
import xml.etree.ElementTree as ET

import pytest

from drivers.base import DriverError, ImageVariantSpec, Invalid, NotFound, Unreachable, VMSpec, VMState
from drivers.libvirt import domxml  # pure XML: does not import libvirt


@pytest.fixture
def lv(libvirt_peer):
    return libvirt_peer


def defined_xml(driver, key):
    return ET.fromstring(driver.conn.lookupByName(key).XMLDesc(0))


def test_facts_follow_each_node_file(libvirt_nodes):
    from drivers.libvirt.driver import LibvirtDriver

    facts = {name: LibvirtDriver(uri).facts() for name, uri in libvirt_nodes.items()}

    assert {name: (f.cpus, f.memory_mib) for name, f in facts.items()} == {
        "kvm-small": (4, 8192),
        "kvm-medium": (16, 65536),
        "kvm-large": (64, 262144),
    }
    assert facts["kvm-large"].extra["cpu_mhz"] == 3000
    assert facts["kvm-small"].hypervisor_type == "kvm"
    assert facts["kvm-small"].version.startswith("TEST")


def test_the_default_test_connection_works_without_naming_a_pool():
    from drivers.libvirt.driver import LibvirtDriver

    facts = LibvirtDriver("test:///default").facts()  # one pool, "default-pool": taken as the pool

    assert facts.cpus > 0 and facts.extra["pool"] == "default-pool"


def test_domain_xml_has_what_the_spec_asks_for(lv):
    spec = lv.spec(vcpus=3, memory_mib=3072, disk_gib=25)

    root = ET.fromstring(domxml.domain_xml(spec, domain_type="kvm", disk_path="/images/vcl-9.qcow2"))

    assert root.get("type") == "kvm"
    assert root.findtext("name") == spec.key
    assert root.findtext("vcpu") == "3"
    assert (root.find("memory").get("unit"), root.findtext("memory")) == ("MiB", "3072")
    disk = root.find("devices/disk")
    assert (disk.find("driver").get("type"), disk.find("source").get("file")) == ("qcow2", "/images/vcl-9.qcow2")
    assert disk.find("target").get("bus") == "virtio"
    nic = root.find("devices/interface")
    assert (nic.get("type"), nic.find("source").get("network")) == ("network", "default")
    assert nic.find("mac").get("address") == domxml.mac_address(spec.key)
    assert root.find("devices/serial").get("type") == "pty"
    assert root.find("devices/console/target").get("type") == "serial"
    assert root.find("features/acpi") is not None
    assert domxml.metadata_of(ET.tostring(root, encoding="unicode"))["fingerprint"] == spec.fingerprint()


def test_domain_xml_escapes_every_value(lv):
    hostile = "net'\"<x>&y"
    spec = dataclasses.replace(lv.spec(), network=hostile)  # validate() would refuse it; the XML must still hold

    text = domxml.domain_xml(spec, domain_type="kvm", disk_path="/a&b/<c>.qcow2")

    root = ET.fromstring(text)
    assert root.find("devices/interface/source").get("network") == hostile
    assert root.find("devices/disk/source").get("file") == "/a&b/<c>.qcow2"
    assert "<x>" not in text
    bridge = ET.fromstring(
        domxml.domain_xml(dataclasses.replace(spec, network="bridge:br0"), domain_type="kvm", disk_path="/d.qcow2")
    )
    assert bridge.find("devices/interface").get("type") == "bridge"
    assert bridge.find("devices/interface/source").get("bridge") == "br0"


def test_a_moved_definition_names_the_target_pools_files_and_keeps_the_rest(lv):
    spec = lv.spec()
    text = domxml.domain_xml(
        spec,
        domain_type="qemu",
        disk_path="/pool-a/vcl-9.qcow2",
        seed_path="/pool-a/s&d.iso",
        network="user",
        forward_port=40000,
    )
    paths = {"/pool-a/vcl-9.qcow2": "/pool-b/vcl-9.qcow2", "/pool-a/s&d.iso": "/pool-b/s&d.iso"}

    moved = domxml.repathed(text, paths)

    assert domxml.disk_paths(moved) == ["/pool-b/vcl-9.qcow2", "/pool-b/s&d.iso"]
    assert domxml.metadata_of(moved) == domxml.metadata_of(text)  # its port, fingerprint, seed: as they were
    assert ET.fromstring(moved).find(f"{{{domxml.QEMU_NAMESPACE}}}commandline") is not None
    assert domxml.repathed(moved, paths) == moved  # a second pass changes nothing


def test_a_resized_definition_has_its_size_at_boot_and_keeps_the_rest(lv):
    text = domxml.domain_xml(lv.spec(vcpus=2, memory_mib=1024), domain_type="qemu", disk_path="/p/vcl-9.qcow2")
    root = ET.fromstring(text)
    root.find("vcpu").set("current", "1")
    root.find("memory").text, root.find("memory").attrib = str(1024 * 1024), {"unit": "KiB"}

    resized = domxml.with_size(ET.tostring(root, encoding="unicode"), 4, 3072)

    assert domxml.size_of(resized) == (4, 3072)
    new = ET.fromstring(resized)
    assert new.find("vcpu").get("current") is None and new.find("currentMemory").text == "3072"
    assert domxml.disk_paths(resized) == domxml.disk_paths(text)
    assert domxml.metadata_of(resized) == domxml.metadata_of(text)
    ET.SubElement(ET.SubElement(new, "cpu"), "numa")
    with pytest.raises(ValueError, match="NUMA"):
        domxml.with_size(ET.tostring(new, encoding="unicode"), 4, 4096)


def test_the_vm_disk_is_a_qcow2_overlay_of_the_staged_image(lv):
    base_path = lv.source.stage_image(lv.image)
    spec = lv.spec()

    lv.source.create(spec)

    root = defined_xml(lv.source, spec.key)
    disk_path = root.find("devices/disk/source").get("file")
    overlay = ET.fromstring(lv.source.conn.storageVolLookupByPath(disk_path).XMLDesc(0))
    assert overlay.findtext("name") == f"{spec.key}.qcow2"
    assert overlay.find("target/format").get("type") == "qcow2"
    assert overlay.findtext("backingStore/path") == base_path
    assert int(overlay.findtext("capacity")) == spec.disk_gib << 30
    assert root.findtext("vcpu") == str(spec.vcpus)


def test_destroy_leaves_no_disk_behind(lv):
    lv.source.stage_image(lv.image)
    spec = lv.spec()
    lv.source.create(spec)

    lv.source.destroy(spec.key)

    names = [vol.name() for vol in lv.source.conn.storagePoolLookupByName("default").listAllVolumes()]
    assert f"{spec.key}.qcow2" not in names
    assert any(name.startswith("ubuntu-24.04-") for name in names)  # the cached base image stays


def test_a_failed_define_removes_the_disk_it_made(libvirt_nodes, lv):
    from drivers.libvirt.driver import LibvirtDriver

    driver = LibvirtDriver(libvirt_nodes["kvm-small"], options={"domain_type": "no-such-hypervisor"})
    driver.stage_image(lv.image)
    spec = lv.spec()

    with pytest.raises(DriverError) as caught:
        driver.create(spec)

    assert caught.value.permanent
    assert f"{spec.key}.qcow2" not in [vol.name() for vol in driver._pool().listAllVolumes()]
    assert driver.state(spec.key) == VMState.ABSENT


def test_staging_uploads_under_a_temporary_name(lv):
    path = lv.source.stage_image(lv.image)

    names = [vol.name() for vol in lv.source._pool().listAllVolumes()]
    assert path.endswith(".qcow2") and not any(name.endswith(".part") for name in names)
    assert lv.source.stage_image(lv.image) == path


def test_a_missing_image_file_is_not_found(lv):
    missing = ImageVariantSpec("ghost", "qcow2", "file:///nonexistent/ghost.qcow2")

    with pytest.raises(NotFound) as caught:
        lv.source.stage_image(missing)

    assert caught.value.permanent


def test_emulated_migration_carries_disk_and_snapshots(lv):
    lv.source.stage_image(lv.image)
    lv.target.stage_image(lv.image)
    spec = lv.spec()
    lv.source.create(spec)
    lv.source.start(spec.key)
    lv.source.snapshot(spec.key, "before-class")

    lv.source.migrate(spec.key, lv.target)

    moved = lv.target.conn.lookupByName(spec.key)
    assert moved.snapshotListNames(0) == ["before-class"]
    assert lv.target._volume(lv.target._pool(), f"{spec.key}.qcow2") is not None
    assert lv.source._volume(lv.source._pool(), f"{spec.key}.qcow2") is None
    lv.target.revert(spec.key, "before-class")
    assert lv.target.state(spec.key) == VMState.RUNNING


def test_suspend_is_a_managed_save(lv):
    lv.source.stage_image(lv.image)
    spec = lv.spec()
    lv.source.create(spec)
    lv.source.start(spec.key)

    lv.source.suspend(spec.key)

    dom = lv.source.conn.lookupByName(spec.key)
    assert dom.hasManagedSaveImage(0) and not dom.isActive()
    lv.source.stop(spec.key, force=True)
    assert not dom.hasManagedSaveImage(0)


def test_a_vm_paused_by_someone_else_counts_as_suspended(lv):
    lv.source.stage_image(lv.image)
    spec = lv.spec()
    lv.source.create(spec)
    lv.source.start(spec.key)
    lv.source.conn.lookupByName(spec.key).suspend()  # virsh suspend: paused in memory

    assert lv.source.state(spec.key) == VMState.SUSPENDED
    lv.source.resume(spec.key)
    assert lv.source.state(spec.key) == VMState.RUNNING


def test_a_bad_vm_name_never_reaches_libvirt(lv):
    with pytest.raises(Invalid):
        lv.source.state("../etc/passwd")
    with pytest.raises(Invalid):
        lv.source.create(VMSpec("x y", 1, 512, 1, lv.image))


def test_a_missing_node_file_is_permanent():
    from drivers.libvirt.driver import LibvirtDriver

    with pytest.raises(DriverError) as caught:
        LibvirtDriver("test:///nonexistent/node.xml").facts()

    assert caught.value.permanent and not isinstance(caught.value, Unreachable)


def test_a_missing_pool_option_is_not_found(libvirt_nodes):
    from drivers.libvirt.driver import LibvirtDriver

    with pytest.raises(NotFound, match="no-pool"):
        LibvirtDriver(libvirt_nodes["kvm-small"], options={"pool": "no-pool"}).facts()


def test_a_suspended_vm_moves_unless_its_host_is_on_shared_storage():
    from drivers.libvirt.driver import LibvirtDriver

    assert LibvirtDriver("test:///default").moves_suspended
    assert not LibvirtDriver("test:///default", options={"shared_storage": True}).moves_suspended


def test_migrating_between_kinds_is_refused(lv, sim_peer):
    with pytest.raises(Invalid):
        lv.source.migrate("vcl-1", sim_peer.target)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def image_server(tmp_path, settings):
    """A real HTTP server (the image repository) serving tmp_path/images, allow-listed (an image
    server on 127.0.0.1 is refused by default: it is no public address)."""
    settings.VCLMGR_OUTBOUND_ALLOW = ["127.0.0.1"]
    root = tmp_path / "images"
    root.mkdir()
    handler = functools.partial(QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_it_stages_an_image_from_a_repository_over_http(lv, image_server):
    root, base_url = image_server
    content = b"qcow2 from the repository"
    (root / "centos.qcow2").write_bytes(content)
    image = ImageVariantSpec(
        "centos-9", "qcow2", f"{base_url}/centos.qcow2", "sha256:" + hashlib.sha256(content).hexdigest()
    )

    path = lv.source.stage_image(image)

    assert path.endswith(".qcow2") and "centos-9-" in path
    with pytest.raises(Invalid, match="checksum mismatch"):
        lv.source.stage_image(dataclasses.replace(image, checksum="sha256:" + "1" * 64))
    with pytest.raises(NotFound, match="404") as caught:
        lv.source.stage_image(dataclasses.replace(image, location=f"{base_url}/missing.qcow2", checksum=""))
    assert caught.value.permanent


# --- the guest: NoCloud seed, per-host options, user-mode networking --------------------------


def login():
    from drivers import cloudinit

    return cloudinit.GuestLogin(
        instance_id="vcl-1-abc",
        hostname="vcl-1",
        login="alice",
        password_hash=cloudinit.password_hash("s3cret-pw"),
        ssh_keys=("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGJ0ZXN0 alice@laptop",),
    )


def volumes(driver):
    return sorted(vol.name() for vol in driver._pool().listAllVolumes())


def test_a_guest_login_becomes_a_seed_volume_attached_as_a_read_only_cdrom(lv):
    lv.source.stage_image(lv.image)
    spec = lv.spec(guest=login())
    lv.source.create(spec)
    lv.source.create(spec)  # a retried create adopts the domain: no second seed

    assert volumes(lv.source).count(f"{spec.key}-seed.iso") == 1
    cdrom = defined_xml(lv.source, spec.key).find("devices/disk[@device='cdrom']")
    assert cdrom.find("source").get("file").endswith(f"/{spec.key}-seed.iso") and cdrom.find("readonly") is not None
    root = defined_xml(lv.source, spec.key)
    assert root.find("features/acpi") is not None
    assert root.find("devices/channel/target").get("name") == "org.qemu.guest_agent.0"

    lv.source.destroy(spec.key)
    assert not [name for name in volumes(lv.source) if name.startswith(spec.key)]


def test_reseed_rewrites_the_seed_volume_and_none_empties_the_cdrom_tray(lv):
    lv.source.stage_image(lv.image)
    spec = lv.spec(guest=login())
    lv.source.create(spec)
    nextone = dataclasses.replace(login(), instance_id="vcl-1-def")

    lv.source.reseed(spec.key, None)
    cdrom = defined_xml(lv.source, spec.key).find("devices/disk[@device='cdrom']")
    assert cdrom.find("source") is None and f"{spec.key}-seed.iso" not in volumes(lv.source)
    assert "instance" not in domxml.metadata_of(lv.source.conn.lookupByName(spec.key).XMLDesc(0))

    lv.source.reseed(spec.key, nextone)
    cdrom = defined_xml(lv.source, spec.key).find("devices/disk[@device='cdrom']")
    assert cdrom.find("source").get("file").endswith(f"/{spec.key}-seed.iso")
    assert volumes(lv.source).count(f"{spec.key}-seed.iso") == 1
    meta = domxml.metadata_of(lv.source.conn.lookupByName(spec.key).XMLDesc(0))
    assert meta["instance"] == "vcl-1-def" and meta["fingerprint"] == spec.fingerprint()


def test_a_spec_without_a_guest_gets_no_seed(lv):
    lv.source.stage_image(lv.image)
    spec = lv.spec()
    lv.source.create(spec)
    assert f"{spec.key}-seed.iso" not in volumes(lv.source)
    assert defined_xml(lv.source, spec.key).find("devices/disk[@device='cdrom']") is None


def test_a_bad_image_user_data_leaves_no_disk_and_no_seed(lv):
    lv.source.stage_image(lv.image)
    bad = dataclasses.replace(login(), image_user_data="#cloud-config\nhostname: elsewhere\n")
    spec = lv.spec(guest=bad)
    with pytest.raises(Invalid, match="hostname is set by the reservation"):
        lv.source.create(spec)
    assert not [name for name in volumes(lv.source) if name.startswith(spec.key)]


def test_user_mode_networking_forwards_the_login_port_from_the_hosts_loopback(libvirt_nodes, lv):
    from drivers.libvirt.driver import LibvirtDriver

    driver = LibvirtDriver(libvirt_nodes["kvm-small"], options={"network": "user"})
    driver.stage_image(lv.image)
    spec = lv.spec(extra={"guest_port": 22})
    driver.create(spec)
    port = driver.port(spec.key, 22)
    assert port != 22 and defined_xml(driver, spec.key).find("devices/interface") is None
    # libvirt's test driver drops <qemu:commandline>: the XML the driver authors shows the forward.
    root = ET.fromstring(domxml.domain_xml(spec, domain_type="qemu", disk_path="/d", network="user", forward_port=port))
    args = [arg.get("value") for arg in root.iter(f"{{{domxml.QEMU_NAMESPACE}}}arg")]
    assert f"user,id=vclnet0,restrict=on,hostfwd=tcp:127.0.0.1:{port}-:22" in args
    driver.start(spec.key)
    assert driver.address(spec.key) == "127.0.0.1"
    driver.destroy(spec.key)


@pytest.mark.parametrize(
    ("options", "cpu"),
    [
        ({}, "host-model"),
        ({"domain_type": "qemu"}, None),
        ({"domain_type": "qemu", "cpu_mode": "custom:qemu64"}, "custom"),
        ({"cpu_mode": "host-passthrough"}, "host-passthrough"),
    ],
)
def test_the_cpu_mode_follows_the_host_options(lv, options, cpu):
    from drivers.libvirt.driver import LibvirtDriver

    driver = LibvirtDriver("test:///default", options={"domain_type": "kvm", **options})
    text = domxml.domain_xml(lv.spec(), domain_type=driver._domain_type(), disk_path="/d", cpu_mode=driver._cpu_mode())
    root = ET.fromstring(text)
    assert (root.find("cpu").get("mode") if root.find("cpu") is not None else None) == cpu


@pytest.mark.parametrize(
    ("options", "cache"),
    [
        ({}, "none"),
        ({"domain_type": "qemu"}, None),
        ({"domain_type": "qemu", "disk_cache": "none"}, "none"),
        ({"disk_cache": "default"}, None),
        ({"disk_cache": "writeback"}, "writeback"),
    ],
)
def test_the_disk_cache_is_uncached_on_kvm_and_the_page_cache_under_emulation(lv, options, cache):
    # Under software emulation an uncached disk made every boot cost ~2.7 CPU s more.
    from drivers.libvirt.driver import LibvirtDriver

    driver = LibvirtDriver("test:///default", options={"domain_type": "kvm", **options})
    text = domxml.domain_xml(
        lv.spec(), domain_type=driver._domain_type(), disk_path="/d", disk_cache=driver._disk_cache()
    )
    assert ET.fromstring(text).find("devices/disk[@device='disk']/driver").get("cache") == cache


def test_an_unknown_disk_cache_is_refused():
    from drivers.libvirt.driver import LibvirtDriver

    with pytest.raises(Invalid, match="disk_cache 'fast'"):
        LibvirtDriver("test:///default", options={"disk_cache": "fast"})


@pytest.mark.parametrize("mode", ["host-model", "host-passthrough"])
def test_software_emulation_refuses_a_host_cpu_mode(mode):
    from drivers.libvirt.driver import LibvirtDriver

    with pytest.raises(Invalid, match="needs domain_type kvm"):
        LibvirtDriver("test:///default", options={"domain_type": "qemu", "cpu_mode": mode})
    with pytest.raises(Invalid, match="cpu_mode"):
        LibvirtDriver("test:///default", options={"cpu_mode": "fast"})
