"""A libvirt host's GPUs: discovery, the devices a new VM gets, and its vGPUs' lifecycle.

- Discovery lists the host's PCI node devices (``virConnectListAllNodeDevices``) and reads
  them with ``nodedev`` (pure).
- A VM asking for GPUs (``VMSpec.gpus``, model → count) gets, per model, whole GPUs that no
  other domain defined on the host holds (read from their ``<hostdev>``s), or new mediated
  devices (vGPUs) of the model's type on a parent that can still make one. Not enough is a
  ``Conflict`` naming the model and the host, raised before anything is made.
- A vGPU is defined persistently and started through the node-device API
  (``virNodeDeviceDefineXML`` + ``virNodeDeviceCreate``, autostarted with the host; where
  libvirt is older than 7.3, ``virNodeDeviceCreateXML``: a transient one, which a host reboot
  takes away, so the VM must be built again), its UUID derived from the VM, so a retried create
  makes no second one.
  ``destroy`` removes the VM's vGPUs; ``start`` starts any that is defined but not active.
- libvirt's test driver lists node devices from its node file but cannot make mediated
  devices: there the domain is defined with the vGPUs' UUIDs and nothing is made. Passthrough
  itself (vfio, an IOMMU) is never exercised by the tests.
"""

import contextlib
import logging
import threading

import libvirt

from drivers.base import Conflict
from drivers.libvirt import nodedev
from drivers.libvirt.connection import translate

log = logging.getLogger(__name__)

# Two creates on one host in one process must not pick the same free GPU (across processes
# libvirt refuses to start the second domain that holds a device in use).
_locks = {}
_locks_lock = threading.Lock()


def choosing(driver, spec):
    """Held from choosing ``spec``'s devices to defining its domain (nothing without GPUs)."""
    if not spec.gpus:
        return contextlib.nullcontext()
    with _locks_lock:
        return _locks.setdefault(driver.uri, threading.Lock())


def _pci_xml(driver):
    devices = driver._call(
        "list PCI devices", driver.conn.listAllDevices, libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_PCI_DEV
    )
    return [driver._call(f"definition of {dev.name()}", dev.XMLDesc, 0) for dev in devices]


def host_devices(driver):
    """The host's device records (``HostFacts.devices``); None where libvirt cannot list them."""
    try:
        listed = driver.conn.listAllDevices(libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_PCI_DEV)
        xml_texts = [dev.XMLDesc(0) for dev in listed]
    except libvirt.libvirtError as exc:
        log.info("%s: node devices not listed: %s", driver.host_name, exc)
        return None
    return nodedev.device_records(xml_texts)


def in_use(driver, key):
    """PCI addresses held by the host's domains other than ``key``."""
    held = set()
    for dom in driver._call("list domains", driver.conn.listAllDomains):
        if dom.name() != key:
            held |= nodedev.used_by(driver._call(f"definition of {dom.name()}", dom.XMLDesc, 0))[0]
    return held


def choose(driver, spec):
    """The devices ``spec`` gets on this host (``nodedev.Passthrough``); a Conflict when too few."""
    if not spec.gpus:
        return nodedev.Passthrough()
    found, held = nodedev.found_all(_pci_xml(driver)), in_use(driver, spec.key)
    try:
        return nodedev.choose(found, spec.gpus, held, spec.key, spec.fingerprint(), driver.host_name)
    except LookupError as exc:
        raise Conflict(f"{spec.key}: {exc}") from None


def make_mdevs(driver, passthrough):
    """Make (define and start) the vGPUs of ``passthrough``; the ones made, for ``remove``.
    On a failure, those made so far are removed again before the error goes up."""
    made = []
    if driver.emulated or not passthrough.mdevs:
        return made  # the test driver cannot make mediated devices (see the module docstring)
    try:
        for parent, type_id, uuid in passthrough.mdevs:
            if _lookup(driver, uuid) is None:
                _make(driver, nodedev.mdev_xml(parent, type_id, uuid), uuid)
                made.append(uuid)
    except BaseException:
        remove(driver, made)
        raise
    return made


def _make(driver, xml, uuid):
    conn = driver.conn
    try:
        dev = conn.nodeDeviceDefineXML(xml, 0)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() != libvirt.VIR_ERR_NO_SUPPORT:
            raise translate(exc, f"define vGPU {uuid} on {driver.host_name}") from exc
        driver._call(f"create vGPU {uuid} on {driver.host_name}", conn.nodeDeviceCreateXML, xml, 0)
        return
    driver._call(f"autostart vGPU {uuid}", dev.setAutostart, 1)
    driver._call(f"start vGPU {uuid} on {driver.host_name}", dev.create, 0)


def _lookup(driver, uuid):
    try:
        return driver.conn.nodeDeviceLookupByName(nodedev.mdev_name(uuid))
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_NODE_DEVICE:
            return None
        raise translate(exc, f"vGPU {uuid} on {driver.host_name}") from exc


def start_mdevs(driver, domain_xml_text):
    """Before a domain starts: its vGPUs active (a defined one may have been stopped)."""
    if driver.emulated:
        return
    for uuid in sorted(nodedev.used_by(domain_xml_text)[1]):
        dev = _lookup(driver, uuid)
        if dev is not None and not dev.isActive():
            driver._call(f"start vGPU {uuid}", dev.create, 0)


def remove(driver, uuids):
    """Stop and undefine the vGPUs ``uuids`` (absent ones are fine: destroy is idempotent)."""
    if driver.emulated:
        return
    for uuid in uuids:
        dev = _lookup(driver, uuid)
        if dev is None:
            continue
        if dev.isActive():
            driver._call(f"stop vGPU {uuid}", dev.destroy)
        if dev.isPersistent():
            driver._call(f"undefine vGPU {uuid}", dev.undefine, 0)
