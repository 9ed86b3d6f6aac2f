"""Discovery's peers: libvirt's test driver (node XML files) and vcsim, as the driver tests start them."""

import pytest

from tests.drivers.conftest import libvirt_nodes, silent_libvirt, vcsim  # noqa: F401 (fixtures)


@pytest.fixture(autouse=True)
def _loopback_allowed(settings):
    """vcsim and the silent peers listen on 127.0.0.1, which the outbound policy refuses by default."""
    settings.VCLMGR_OUTBOUND_ALLOW = ["127.0.0.1"]
