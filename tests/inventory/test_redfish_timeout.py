"""A BMC that accepts connections and never answers (tests/silent_peer.py): the Redfish session
gives up after VCLMGR_BMC_TIMEOUT and says the BMC is unreachable."""

import pytest

from inventory import redfish
from inventory.models import BMC
from tests.silent_peer import SilentPeer, outcome_within


@pytest.mark.parametrize("scheme", ["https", "http"])
def test_a_silent_bmc_is_unreachable_within_the_timeout(settings, scheme):
    settings.VCLMGR_BMC_TIMEOUT = 1
    settings.VCLMGR_OUTBOUND_ALLOW = ["127.0.0.1"]  # the silent peer's address, refused by default
    with SilentPeer() as peer:
        bmc = BMC(address=f"{scheme}://127.0.0.1:{peer.port}", credential=None, system="1", verify_tls=False)
        _, error, took = outcome_within(20, redfish.Session, bmc)
        assert isinstance(error, redfish.BMCError) and error.kind == "unreachable", error
        assert "timed out after 1 s" in str(error) and peer.accepted >= 1 and took < 10
