"""Discovery of a vCenter's hosts against VMware's vSphere simulator (vcsim)."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from drivers import registry as drivers
from inventory.discovery import services
from inventory.models import Credential, Hypervisor
from tests.vcsim import VCSIM_PASSWORD, VCSIM_USER

pytestmark = [pytest.mark.django_db, pytest.mark.slow]
WRONG = "wrong-password"  # noqa: S105


def with_user(url):
    return url.replace("://", f"://{VCSIM_USER}@", 1)


def test_it_registers_every_host_and_stores_the_password_as_a_credential(vcsim, group):
    found = services.discover(
        "vmware", with_user(vcsim.url), actor="test", password=VCSIM_PASSWORD, group="lab", commit=True
    )
    assert found.committed, found.report.messages()
    names = sorted(host["name"] for host in vcsim.hosts)
    assert sorted(Hypervisor.objects.values_list("name", flat=True)) == names
    credential = Credential.objects.get(name=found.credential)
    assert credential.username == VCSIM_USER and credential.get_secret() == VCSIM_PASSWORD
    by_name = {host["name"]: host for host in vcsim.hosts}
    for host in Hypervisor.objects.all():
        assert host.driver == "vmware" and host.group == group and host.credential == credential
        assert host.uri == f"{vcsim.url}?host={host.name}" and VCSIM_PASSWORD not in host.uri
        assert (host.cpus, host.memory_mib) == (by_name[host.name]["cpus"], by_name[host.name]["memory_mib"])
        assert host.address == "127.0.0.1" and host.facts["reachable"] is True
    # Each registered host reaches its own ESX host through the stored credential.
    host = Hypervisor.objects.order_by("name").last()
    assert drivers.driver_for(host).facts().name == host.name


def test_the_command_reads_the_password_from_a_file_and_previews(vcsim, tmp_path):
    secret = tmp_path / "password"
    secret.write_text(VCSIM_PASSWORD + "\n")
    out = StringIO()
    call_command("discover", "vcenter", "--url", with_user(vcsim.url), "--password-file", str(secret), stdout=out)
    text = out.getvalue()
    assert text.count("create ") == len(vcsim.hosts) and "preview only" in text and VCSIM_PASSWORD not in text
    assert not Hypervisor.objects.exists() and not Credential.objects.exists()


def test_bad_credentials_fail_clearly_and_write_nothing(vcsim, monkeypatch):
    with pytest.raises(services.DiscoveryError, match="Login failure|InvalidLogin") as caught:
        services.discover("vmware", with_user(vcsim.url), actor="test", password=WRONG, commit=True)
    assert caught.value.permanent and WRONG not in str(caught.value)
    monkeypatch.setenv("VCLMGR_VCENTER_PASSWORD", WRONG)
    with pytest.raises(CommandError, match="nothing was written"):
        call_command("discover", "vcenter", "--url", with_user(vcsim.url), "--commit", stdout=StringIO())
    assert not Hypervisor.objects.exists() and not Credential.objects.exists()


def test_the_api_never_returns_the_password(api, admin_user, vcsim):
    url = "/api/v1/hypervisors/discover/"
    body = {"driver": "vmware", "uri": vcsim.url, "username": VCSIM_USER, "password": VCSIM_PASSWORD}
    response = api(admin_user).post(url, {**body, "commit": True}, format="json")
    assert response.status_code == 201, response.json()
    assert VCSIM_PASSWORD not in response.content.decode()
    assert response.json()["totals"]["created"] == len(vcsim.hosts) and response.json()["credential_created"]
    refused = api(admin_user).post(url, {**body, "password": "nope"}, format="json")
    assert refused.status_code == 400 and "Login failure" in refused.json()["error"]["message"]
    unreachable = api(admin_user).post(url, {**body, "uri": "http://127.0.0.1:9/sdk"}, format="json")
    assert unreachable.status_code == 502 and "nothing was written" in unreachable.json()["error"]["message"]
