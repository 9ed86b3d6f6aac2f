"""A host's BMC in the inventory: its fields through the API, the import and export, and
reading the power state from a real Redfish service (sushy-emulator)."""

import pytest
from django.urls import reverse

from inventory import power, services
from inventory.models import Hypervisor
from tests import redfish
from tests.inventory.conftest import TEST, host_row, import_csv


@pytest.fixture(autouse=True)
def _short_timeout(settings):
    settings.VCLMGR_BMC_TIMEOUT = 2


def test_the_api_reads_the_power_state_and_never_returns_the_secret(
    api, admin_user, alice, make_host, redfish_bmc, bmc_host
):
    emulator = redfish_bmc({"node-1": "on"})
    host = bmc_host(make_host(name="node-1"), emulator, "node-1")
    url = f"/api/v1/hypervisors/{host.pk}/power/"
    assert api(alice).get(url).status_code == 403
    response = api(admin_user).get(url)
    assert response.status_code == 200, response.json()
    assert response.json()["power_state"] == "on" and response.json()["power_state_at"]
    detail = api(admin_user).get(f"/api/v1/hypervisors/{host.pk}/").json()
    assert detail["bmc_address"] == emulator.url and detail["bmc_system"] == emulator.systems["node-1"]
    assert detail["power_state"] == "on" and detail["power_standby"] is False
    assert redfish.PASSWORD not in response.content.decode() + str(detail)


def test_a_bmc_that_refuses_is_a_502_and_no_bmc_a_409(api, admin_user, make_host, redfish_bmc, bmc_host):
    emulator = redfish_bmc({"node-1": "on"})
    bare = make_host(name="bare")
    response = api(admin_user).get(f"/api/v1/hypervisors/{bare.pk}/power/")
    assert response.status_code == 409
    assert "bare has no BMC" in response.json()["error"]["message"]
    host = bmc_host(make_host(name="node-1"), emulator, "node-1", password="wrong")  # noqa: S106
    response = api(admin_user).get(f"/api/v1/hypervisors/{host.pk}/power/")
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "upstream" and "refused the credential (HTTP 401)" in error["message"]
    host.refresh_from_db()
    assert host.power_state == "unknown" and host.power_state_at is None


def test_a_blade_inherits_the_chassis_bmc(make_host, redfish_bmc, chassis, db):
    emulator = redfish_bmc({"blade-3": "off", "blade-4": "on"})
    credential = services.create_credential(
        actor=TEST, name="bmc", username=redfish.USERNAME, secret=redfish.PASSWORD, endpoints=[emulator.url]
    )
    services.update_blade_center(
        chassis, actor=TEST, bmc_address=emulator.url, bmc_credential=credential, bmc_verify_tls=False
    )
    blade = make_host(name="blade-3", blade_center=chassis, slot=3, bmc_system=emulator.systems["blade-3"])
    assert power.read_power(blade, actor=TEST) == "off"
    other = make_host(name="blade-4", blade_center=chassis, slot=4)
    with pytest.raises(power.PowerError, match="has 2 systems: set the host's bmc_system"):
        power.read_power(other, actor=TEST)


def test_bmc_addresses_are_checked(make_host, db):
    host = make_host(name="node-1")
    for bad, message in (
        ("ftp://bmc", "expected https://host[:port]"),
        ("https://root:pw@bmc.example.org", "put the login in the BMC credential"),
        ("https://bmc:99999", "cannot parse"),
    ):
        with pytest.raises(services.ValidationError) as caught:
            services.update_hypervisor(host, actor=TEST, bmc_address=bad)
        assert message in str(caught.value.message_dict["bmc_address"])
    assert Hypervisor.objects.get(pk=host.pk).bmc_address == ""


def test_the_import_and_export_carry_the_bmc(db, credential):
    rows = [
        host_row(
            1, bmc_address="https://10.9.0.1", bmc_credential=credential.name, bmc_system="1", bmc_verify_tls="false"
        ),
        host_row(2),
    ]
    report = import_csv(rows)
    assert report.ok, report.messages()
    first = Hypervisor.objects.get(name="h00001")
    assert (first.bmc_address, first.bmc_credential, first.bmc_system, first.bmc_verify_tls) == (
        "https://10.9.0.1",
        credential,
        "1",
        False,
    )
    assert Hypervisor.objects.get(name="h00002").bmc_verify_tls is True
    data = services.export_hypervisors("csv")
    assert b"bmc_address,bmc_credential,bmc_system,bmc_verify_tls" in data
    again = services.import_hypervisors(data, "csv", actor=TEST)
    assert again.ok and again.totals["unchanged"] == 2, again.messages()
    bad = import_csv([host_row(3, bmc_address="telnet://x", bmc_verify_tls="maybe", bmc_credential="nope")])
    text = " ".join(bad.messages())
    assert "bmc_address" in text and "unknown bmc_verify_tls value 'maybe'" in text
    assert "no credential named 'nope'" in text
    assert not Hypervisor.objects.filter(name="h00003").exists()


def test_a_credential_that_logs_in_to_a_bmc_cannot_be_deleted(make_host, db):
    credential = services.create_credential(actor=TEST, name="bmc", username="root", secret="x")  # noqa: S106
    make_host(name="node-1", bmc_address="https://10.9.0.1", bmc_credential=credential)
    with pytest.raises(services.InUse, match="logs in to 1 BMC"):
        services.delete_credential(credential, actor=TEST)


def test_the_host_page_shows_its_power(client, admin_user, make_host, chassis, db):
    client.force_login(admin_user)
    bare = make_host(name="bare")
    assert "no BMC" in client.get(reverse("inventory:hypervisor", args=[bare.pk])).content.decode()
    services.update_blade_center(chassis, actor=TEST, bmc_address="https://10.9.0.1")
    blade = make_host(name="blade-1", blade_center=chassis, slot=1)
    Hypervisor.objects.filter(pk=blade.pk).update(power_state="off", power_standby=True)
    page = client.get(reverse("inventory:hypervisor", args=[blade.pk])).content.decode()
    assert "off (standby: vclmgr powered it off)" in page


def test_the_api_sets_a_hosts_bmc_by_credential_name(api, admin_user, make_host, credential):
    host = make_host(name="node-1")
    url = f"/api/v1/hypervisors/{host.pk}/"
    body = {
        "bmc_address": "https://10.9.0.1:8443",
        "bmc_credential": credential.name,
        "bmc_system": "1",
        "bmc_verify_tls": False,
    }
    response = api(admin_user).patch(url, body, format="json")
    assert response.status_code == 200, response.json()
    assert {k: response.json()[k] for k in body} == body
    response = api(admin_user).patch(url, {"power_state": "on"}, format="json")
    assert Hypervisor.objects.get(pk=host.pk).power_state == "unknown"  # read from the BMC only
    response = api(admin_user).patch(url, {"bmc_address": "gopher://x"}, format="json")
    assert response.status_code == 400 and "bmc_address" in response.json()["error"]["fields"]
