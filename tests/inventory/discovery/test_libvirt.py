"""Discovery of libvirt hosts (libvirt's test driver): preview, commit through the bulk import, bad input."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from drivers import registry as drivers
from inventory.discovery import services
from inventory.models import Hypervisor

pytestmark = pytest.mark.django_db


def run(*args):
    out = StringIO()
    call_command("discover", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_a_preview_reads_the_hosts_and_writes_nothing(libvirt_nodes):
    found = services.discover("libvirt", [libvirt_nodes["kvm-small"], libvirt_nodes["kvm-medium"]], actor="test")
    hosts = found.as_dict()["hosts"]
    assert [(h["name"], h["action"], h["cpus"]) for h in hosts] == [
        ("kvm-small", "create", 4),
        ("kvm-medium", "create", hosts[1]["cpus"]),
    ]
    assert hosts[0]["memory_mib"] == 8192 and hosts[0]["uri"] == libvirt_nodes["kvm-small"]
    assert found.report.dry_run and not found.committed
    assert not Hypervisor.objects.exists()


def test_commit_registers_then_updates_through_the_import(libvirt_nodes, make_host, group):
    make_host("kvm-medium", driver="libvirt", uri=libvirt_nodes["kvm-medium"], cpus=1, memory_mib=512, disk_gib=1)
    found = services.discover("libvirt", list(libvirt_nodes.values()), actor="test", group="lab", commit=True)
    assert found.committed, found.report.messages()
    assert found.report.totals == {"create": 2, "update": 1, "unchanged": 0, "reject": 0}
    small = Hypervisor.objects.get(name="kvm-small")
    assert (small.driver, small.uri, small.group, small.cpus) == ("libvirt", libvirt_nodes["kvm-small"], group, 4)
    assert small.facts["reachable"] is True and small.facts["memory_mib"] == 8192 and small.facts_updated_at
    assert Hypervisor.objects.get(name="kvm-medium").cpus > 1
    # The registered host works with its driver, and a second run changes nothing.
    assert drivers.driver_for(small).facts().cpus == 4
    again = services.discover("libvirt", list(libvirt_nodes.values()), actor="test", group="lab", commit=True)
    assert again.report.totals["unchanged"] == 3 and Hypervisor.objects.count() == 3


def test_the_default_test_uri_is_discovered(db):
    found = services.discover("libvirt", ["test:///default"], actor="test", commit=True)
    assert found.committed, found.report.messages()
    host = Hypervisor.objects.get()
    assert host.uri == "test:///default" and host.cpus > 0
    assert host.driver == "libvirt" and host.name and host.facts["reachable"] is True


def test_a_rejected_host_writes_nothing(libvirt_nodes):
    found = services.discover("libvirt", [libvirt_nodes["kvm-small"]], actor="test", group="no-such-group", commit=True)
    assert not found.committed and not found.report.ok
    assert "no-such-group" in " ".join(found.report.messages())
    assert not Hypervisor.objects.exists()


def test_an_unreadable_uri_fails_clearly_and_writes_nothing(libvirt_nodes, tmp_path):
    with pytest.raises(services.DiscoveryError, match="missing.xml"):
        services.discover(
            "libvirt", [libvirt_nodes["kvm-small"], f"test://{tmp_path}/missing.xml"], actor="test", commit=True
        )
    assert not Hypervisor.objects.exists()


def test_the_command_previews_and_commits(libvirt_nodes):
    out = run("libvirt", libvirt_nodes["kvm-small"], libvirt_nodes["kvm-large"])
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["action", "name", "address"]
    assert lines[1].startswith("create") and "kvm-small" in lines[1] and "preview only" in out
    assert not Hypervisor.objects.exists()
    out = run("libvirt", libvirt_nodes["kvm-small"], libvirt_nodes["kvm-large"], "--commit")
    assert "created 2" in out and "committed" in out
    assert set(Hypervisor.objects.values_list("name", flat=True)) == {"kvm-small", "kvm-large"}
    with pytest.raises(CommandError, match="nothing was written"):
        run("libvirt", "test:///nowhere/missing.xml", "--commit")


def test_the_api_is_for_staff_and_previews_or_commits(api, admin_user, alice, libvirt_nodes):
    url = "/api/v1/hypervisors/discover/"
    body = {"driver": "libvirt", "uris": [libvirt_nodes["kvm-small"]]}
    assert api(alice).post(url, body, format="json").status_code == 403
    preview = api(admin_user).post(url, body, format="json")
    assert preview.status_code == 200, preview.json()
    assert preview.json()["hosts"][0]["action"] == "create" and not Hypervisor.objects.exists()
    committed = api(admin_user).post(url, {**body, "commit": True}, format="json")
    assert committed.status_code == 201, committed.json()
    assert committed.json()["hosts"][0]["id"] == Hypervisor.objects.get(name="kvm-small").pk
    rejected = api(admin_user).post(url, {**body, "commit": True, "group": "nope"}, format="json")
    assert rejected.status_code == 400 and rejected.json()["report"]["hosts"][0]["action"] == "reject"
    bad = api(admin_user).post(url, {"driver": "libvirt", "uri": "test:///x/missing.xml"}, format="json")
    assert bad.status_code in (400, 502) and "nothing was written" in bad.json()["error"]["message"]
    assert api(admin_user).post(url, {"driver": "libvirt"}, format="json").status_code == 400


def test_the_admin_page_previews_then_registers(admin_client, libvirt_nodes):
    changelist = admin_client.get("/admin/inventory/hypervisor/")
    assert b"/admin/inventory/hypervisor/discover/" in changelist.content
    url = "/admin/inventory/hypervisor/discover/"
    form = {"driver": "libvirt", "uris": f"{libvirt_nodes['kvm-small']}\n{libvirt_nodes['kvm-large']}\n"}
    preview = admin_client.post(url, {**form, "preview": "Preview"})
    assert preview.status_code == 200 and b"Register 2 hypervisors" in preview.content
    assert not Hypervisor.objects.exists()
    done = admin_client.post(url, {**form, "confirm": "Register"})
    assert done.status_code == 302 and Hypervisor.objects.count() == 2
    bad = admin_client.post(url, {"driver": "libvirt", "uris": "test:///etc/passwd", "preview": "Preview"})
    assert b"nothing was written" in bad.content and b"root:" not in bad.content
