"""Discovery's peers: libvirt's test driver (node XML files) and vcsim, as the driver tests start them."""

from tests.provisioning.drivers.conftest import libvirt_nodes, silent_libvirt, vcsim  # noqa: F401 (fixtures)
