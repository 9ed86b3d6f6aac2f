"""The drivers' console calls: libvirt domains get a VNC display on the host's
loopback and say where it is; a display vclmgr cannot reach, a stopped VM, a simulated or a
VMware VM each answer ``NoConsole`` with the reason. (A real QEMU guest's display and serial
console: tests/e2e/test_console_real_vm.py.)"""

import xml.etree.ElementTree as ET

import pytest

from drivers.base import NoConsole
from drivers.libvirt import domxml, options


def test_the_domain_gets_a_vnc_display_on_the_hosts_loopback_only(libvirt_peer):
    spec = libvirt_peer.spec()
    root = ET.fromstring(domxml.domain_xml(spec, domain_type="kvm", disk_path="/d"))
    graphics = root.find("devices/graphics")
    assert (graphics.get("type"), graphics.get("autoport"), graphics.get("listen")) == ("vnc", "yes", "127.0.0.1")
    assert graphics.find("listen").attrib == {"type": "address", "address": "127.0.0.1"}
    assert "passwd" not in graphics.attrib
    without = ET.fromstring(domxml.domain_xml(spec, domain_type="kvm", disk_path="/d", vnc_listen=None))
    assert without.find("devices/graphics") is None


def test_the_display_port_is_read_from_the_running_domains_xml():
    live = "<domain><devices><graphics type='vnc' port='5903' listen='127.0.0.1'><listen type='address' address='127.0.0.1'/></graphics></devices></domain>"  # noqa: E501
    assert domxml.vnc_port(live) == ("127.0.0.1", 5903)
    assert domxml.vnc_port(live.replace("5903", "-1")) is None  # defined, not started
    assert domxml.vnc_port("<domain><devices/></domain>") is None


VNC_LISTEN = [("127.0.0.1", True), ("::1", True), ("none", True), ("10.0.0.5", True),
              ("localhost", False), ("", False), (5900, False), ("1.2.3.4'/>", False)]  # fmt: skip


@pytest.mark.parametrize(("value", "ok"), VNC_LISTEN)
def test_vnc_listen_is_an_ip_address_or_none(value, ok):
    assert ("vnc_listen" not in options.errors({"vnc_listen": value})) is ok


def test_a_stopped_or_displayless_libvirt_vm_has_no_console(libvirt_peer):
    driver = libvirt_peer.source
    driver.stage_image(libvirt_peer.image)
    spec = libvirt_peer.spec()
    driver.create(spec)
    with pytest.raises(NoConsole, match="not running"):
        driver.console_address(spec.key)
    with pytest.raises(NoConsole, match="not running"):
        driver.serial_console(spec.key)
    driver.start(spec.key)
    with pytest.raises(NoConsole, match="no VNC display"):  # libvirt's test driver starts no VNC server
        driver.console_address(spec.key)


def test_a_remote_hosts_loopback_display_is_refused_with_what_to_set():
    from drivers.libvirt.driver import _local

    assert _local("qemu:///system") and _local("qemu+unix:///system?socket=/run/x") and _local("test:///default")
    assert not _local("qemu+ssh://root@kvm1.example.org/system") and not _local("qemu+tls://kvm1/system")


def test_simulated_and_vmware_vms_say_why_they_have_no_console(sim_peer):
    from drivers.vmware.driver import VMwareDriver

    with pytest.raises(NoConsole, match="simulated VM"):
        sim_peer.source.console_address("vcl-1")
    with pytest.raises(NoConsole, match="simulated VM"):
        sim_peer.source.serial_console("vcl-1")
    vmware = VMwareDriver("https://vcenter.example.org/sdk", {"username": "u", "password": "p"})
    with pytest.raises(NoConsole, match="WebMKS"):
        vmware.console_address("vcl-1")
