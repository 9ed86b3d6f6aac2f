"""A host's credential goes only to the URI it was saved for (``Credential.endpoints``): an
operator who points a host at their own listener gets no connection, so no secret."""

import pytest

from drivers import registry
from drivers.base import Unauthorized
from inventory import services as inventory
from tests.drivers.conftest import VCSIM_PASSWORD, VCSIM_USER
from tests.listeners import tcp_listener

TEST = "test"
SECRET = "s3cret"  # noqa: S105 (made up here)


@pytest.fixture
def listener():
    """A 127.0.0.1 listener that records what each connection sent first (and closes it)."""
    accepted = []

    def record(conn, stop):
        conn.settimeout(2)
        try:
            accepted.append(conn.recv(4096))
        except TimeoutError:
            accepted.append(b"")

    with tcp_listener(record) as port:
        yield port, accepted


def test_a_vmware_host_moved_to_another_listener_sends_nothing(db, vcsim, make_host, listener):
    port, accepted = listener
    name = vcsim.hosts[0]["name"]
    credential = inventory.create_credential(
        actor=TEST, name="vcsim", username=VCSIM_USER, secret=VCSIM_PASSWORD, endpoints=[vcsim.url]
    )
    host = make_host("esx-bound", driver="vmware", uri=f"{vcsim.url}?host={name}", credential=credential)
    assert registry.driver_for(host).facts().name == name  # where it was saved for, it works

    inventory.update_hypervisor(host, actor=TEST, uri=f"http://127.0.0.1:{port}/sdk?host={name}")
    with pytest.raises(Unauthorized, match=rf"credential vcsim was not saved for http://127.0.0.1:{port}"):
        registry.driver_for(host).facts()
    assert accepted == []


def test_a_libvirt_host_moved_to_another_listener_sends_nothing(db, settings, make_host, listener):
    settings.VCLMGR_LIBVIRT_OPEN_TIMEOUT = 2
    port, accepted = listener
    credential = inventory.create_credential(
        actor=TEST, name="sasl", username="admin", secret=SECRET, endpoints=["qemu+tcp://kvm01.example.org/system"]
    )
    host = make_host("kvm-bound", driver="libvirt", uri="qemu+tcp://kvm01.example.org/system", credential=credential)
    inventory.update_hypervisor(host, actor=TEST, uri=f"test+tcp://127.0.0.1:{port}/default")

    with pytest.raises(Unauthorized, match=r"was not saved for test\+tcp://127.0.0.1"):
        registry.driver_for(host).facts()
    assert accepted == []


def test_a_local_uri_needs_no_binding(db, make_host, libvirt_nodes):
    credential = inventory.create_credential(actor=TEST, name="local", username="admin", secret=SECRET)
    host = make_host("kvm-local", driver="libvirt", uri=libvirt_nodes["kvm-small"], credential=credential)
    assert registry.driver_for(host).facts().cpus > 0
