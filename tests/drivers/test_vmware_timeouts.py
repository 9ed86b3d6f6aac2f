"""vSphere against a silent peer (tests/silent_peer.py): signing in to an endpoint that accepts
and never answers fails, retryably, within VCLMGR_VSPHERE_TIMEOUT."""

from drivers import registry
from drivers.base import Unreachable
from drivers.vmware.session import sessions
from tests.silent_peer import SilentPeer, outcome_within


def facts(url):
    driver = registry.get_driver("vmware", url, {"username": "vclmgr", "password": "not-asked"})
    try:
        return driver.facts()
    finally:
        sessions.forget(driver)


def test_a_silent_endpoint_fails_within_the_timeout(settings):
    settings.VCLMGR_VSPHERE_TIMEOUT = 0.5
    with SilentPeer() as peer:
        _, error, took = outcome_within(10, facts, f"http://127.0.0.1:{peer.port}/sdk")
        assert isinstance(error, Unreachable) and not error.permanent, error
        assert f"cannot connect to 127.0.0.1:{peer.port} as vclmgr" in str(error) and "timed out" in str(error)
        assert peer.received > 0 and took < 5
        assert "not-asked" not in str(error)
