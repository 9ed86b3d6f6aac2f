"""Discovery opens only URIs the outbound policy allows, and sends a stored credential only to
the URIs it was saved for; both refused before any connection (``connects`` records none)."""

import pytest

from inventory import services as inventory
from inventory.discovery import services
from inventory.models import Hypervisor
from tests.inventory.conftest import TEST
from tests.processes import free_port

pytestmark = pytest.mark.django_db


INTERNAL = ["https://169.254.169.254/sdk", "https://10.0.0.1/sdk", "https://[::1]/sdk", "https://vcenter/sdk",
            "https://vc.corp.internal/sdk", "https://0x7f.1/sdk"]  # fmt: skip


@pytest.mark.parametrize("uri", INTERNAL)
def test_a_uri_on_an_internal_address_is_refused_before_it_is_opened(uri, connects, settings):
    settings.VCLMGR_OUTBOUND_ALLOW = []  # the production default
    with pytest.raises(services.DiscoveryError, match="not allowed") as caught:
        services.discover("vmware", uri, actor=TEST, username="root", password="vc-pass-1", commit=True)  # noqa: S106
    assert caught.value.permanent and "vc-pass-1" not in str(caught.value)
    assert connects == [] and not Hypervisor.objects.exists()


def test_the_api_says_so_with_a_400(api, admin_user, connects, settings):
    settings.VCLMGR_OUTBOUND_ALLOW = []
    body = {"driver": "vmware", "uri": "https://169.254.169.254/sdk", "username": "root", "password": "vc-pass-1"}
    refused = api(admin_user).post("/api/v1/hypervisors/discover/", body, format="json")
    assert refused.status_code == 400 and "not allowed" in refused.json()["error"]["message"]
    assert connects == []


def test_a_stored_credential_goes_only_to_the_uris_it_was_saved_for(connects):
    inventory.create_credential(
        actor=TEST,
        name="vc",
        username="root",
        secret="vc-pass-1",  # noqa: S106
        endpoints=["https://vc.example.org/sdk"],
    )
    elsewhere = f"https://127.0.0.1:{free_port()}/sdk"  # allow-listed here: only the binding refuses it
    with pytest.raises(services.DiscoveryError, match="credential vc was not saved for"):
        services.discover("vmware", elsewhere, actor=TEST, credential="vc", commit=True)
    assert connects == []
