"""Discovery of a libvirt URI or a vCenter whose peer accepts and never answers
(tests/silent_peer.py): the web request, the API's or the admin page's, answers within the
driver's timeout and writes nothing."""

import pytest

from inventory.models import Hypervisor
from tests.silent_peer import SilentPeer, outcome_within

# transaction=True: the request runs in a thread of its own (a hang fails the test), which sees
# only committed rows.
pytestmark = pytest.mark.django_db(transaction=True)


def test_the_api_answers_502_within_the_open_timeout(api, admin_user, silent_libvirt):
    peer = silent_libvirt()
    uri = f"qemu+tcp://127.0.0.1:{peer.port}/system"
    client = api(admin_user)
    answer, error, took = outcome_within(
        10, client.post, "/api/v1/hypervisors/discover/", {"driver": "libvirt", "uri": uri}, format="json"
    )
    assert error is None and answer.status_code == 502, answer.content
    message = answer.json()["error"]["message"]
    assert "no answer within 0.5 s" in message and "nothing was written" in message
    assert peer.accepted == 1 and took < 5 and not Hypervisor.objects.exists()


def test_the_admin_page_says_so_within_the_open_timeout(admin_client, silent_libvirt):
    peer = silent_libvirt()
    form = {"driver": "libvirt", "uris": f"qemu+tcp://127.0.0.1:{peer.port}/system", "preview": "Preview"}
    page, error, took = outcome_within(10, admin_client.post, "/admin/inventory/hypervisor/discover/", form)
    assert error is None and page.status_code == 200
    assert b"no answer within 0.5 s" in page.content and took < 5


def test_a_silent_vcenter_answers_502_within_the_vsphere_timeout(api, admin_user, settings):
    settings.VCLMGR_VSPHERE_TIMEOUT = 0.5
    with SilentPeer() as peer:
        body = {"driver": "vmware", "uri": f"http://127.0.0.1:{peer.port}/sdk", "username": "u", "password": "p"}
        answer, error, took = outcome_within(
            10, api(admin_user).post, "/api/v1/hypervisors/discover/", body, format="json"
        )
        assert error is None and answer.status_code == 502, answer.content
        assert "timed out" in answer.json()["error"]["message"] and took < 5
