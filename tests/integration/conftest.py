"""A real libvirtd + QEMU for the integration tests (see tests/realvm.py for how it is
shared and stopped). Session scope: each xdist worker registers with the one shared daemon
and the last one out stops it."""

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
