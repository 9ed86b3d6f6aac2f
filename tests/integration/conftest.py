"""A real libvirtd + QEMU for the integration tests (see tests/realvm.py for how it is
shared and stopped). Session scope: each xdist worker registers with the one shared daemon
and the last one out stops it. ``two_hosts``: two more daemons as two KVM hosts, for moving
running guests between hosts (tests/twohosts.py), one pair per module."""

import contextlib
import subprocess

import pytest

from tests import realvm


@pytest.fixture(scope="session")
def libvirtd():
    try:
        daemon = realvm.Libvirtd.acquire()
    except (realvm.RealVMError, OSError) as exc:
        pytest.fail(f"cannot start a private libvirtd: {exc}\nDebian packages: make install-dev", pytrace=False)
    yield daemon
    daemon.release()


@pytest.fixture(scope="session")
def libvirt_conn(libvirtd):
    import libvirt

    conn = libvirt.open(libvirtd.uri)
    yield conn
    conn.close()


@pytest.fixture(scope="session")
def guest_image():
    try:
        return realvm.guest_image()
    except (realvm.RealVMError, OSError) as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def guest_pool(libvirt_conn, guest_image):
    """This worker's storage pool with the guest image staged into it."""
    pool = realvm.Pool(libvirt_conn, guest_image)
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def two_hosts():
    """Two KVM hosts on this machine (``tests/twohosts.py``): two private libvirtd daemons in
    namespaces of their own, a network segment both see, a directory both see. Shared by a
    module (each daemon probes QEMU once); stopped, with everything in it, after the module."""
    with started_two_hosts() as hosts:
        yield hosts


@contextlib.contextmanager
def started_two_hosts(**options):
    """``twohosts.TwoHosts(**options)`` started, its sockets trusted by vclmgr's libvirt driver;
    stopped on the way out (for a module that overrides ``two_hosts`` with its own options)."""
    from django.conf import settings

    from tests import twohosts

    hosts = twohosts.TwoHosts(**options)
    try:
        hosts.start()
    except (twohosts.TwoHostsError, OSError, subprocess.SubprocessError) as exc:
        pytest.fail(f"cannot start two private libvirtd hosts: {exc}\nDebian packages: make install-dev", pytrace=False)
    trusted = settings.VCLMGR_LIBVIRT_SOCKETS
    settings.VCLMGR_LIBVIRT_SOCKETS = [*trusted, *(str(host.socket) for host in hosts.hosts)]
    try:
        yield hosts
    finally:
        settings.VCLMGR_LIBVIRT_SOCKETS = trusted
        from drivers.libvirt.connection import connections

        for host in hosts.hosts:
            connections.forget(host.uri)
        hosts.stop()
