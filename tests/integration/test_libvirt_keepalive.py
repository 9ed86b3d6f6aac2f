"""A libvirt daemon that answers, then falls silent mid-connection (a relay on 127.0.0.1 to the
private libvirtd that stops passing bytes on, tests/silent_peer.py): the next call fails,
retryably, after VCLMGR_LIBVIRT_CALL_TIMEOUT (libvirt's keepalive) instead of waiting for ever."""

from drivers import registry
from drivers.base import Unreachable
from drivers.libvirt import connection
from tests.silent_peer import FallingSilent, outcome_within


def test_a_call_to_a_daemon_that_fell_silent_fails_after_the_call_timeout(libvirtd, settings):
    settings.VCLMGR_LIBVIRT_CALL_TIMEOUT = 2
    with FallingSilent(str(libvirtd.sock_dir / "libvirt-sock")) as relay:
        uri = f"qemu+tcp://127.0.0.1:{relay.port}/system"
        try:
            driver = registry.get_driver("libvirt", uri)
            assert isinstance(driver.list_vms(), list)  # answered through the relay
            relay.silence()
            _, error, took = outcome_within(30, driver.list_vms)
            assert isinstance(error, Unreachable) and not error.permanent, error
            assert "keepalive" in str(error) and took < 20
        finally:
            connection.connections.forget(uri)
