"""Which class drives which kind of hypervisor, imported on first use.

libvirt and pyVmomi are imported by their driver modules only, so a process that never
touches a libvirt or VMware host never loads them.
"""

from django.utils.module_loading import import_string

from provisioning.drivers.base import Invalid

DRIVERS = {
    "sim": "provisioning.drivers.sim.driver.SimDriver",
    "libvirt": "provisioning.drivers.libvirt.driver.LibvirtDriver",
    "vmware": "provisioning.drivers.vmware.driver.VMwareDriver",
}


def driver_class(kind):
    try:
        path = DRIVERS[kind]
    except KeyError:
        raise Invalid(f"unknown driver {kind!r} (one of {', '.join(DRIVERS)})") from None
    return import_string(path)


def get_driver(kind, uri, credentials=None, options=None):
    """A driver for one host. ``credentials``: ``{"username", "password"}``; ``options``: per driver."""
    return driver_class(kind)(uri, credentials=credentials, options=options)
