"""The admin: pages render, saves go through the services, import/export, registration, actions."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import override_settings

from core import changelog
from inventory import services
from inventory.models import BladeCenter, Hypervisor
from tests.inventory.conftest import TEST, host_row, to_csv


@pytest.fixture
def admin_client(client, admin_user):
    client.force_login(admin_user)
    return client


@pytest.mark.parametrize("model", ["hypervisor", "bladecenter", "nodegroup", "credential"])
def test_admin_pages_render(db, admin_client, model, make_host, chassis, group, credential):
    host = make_host(blade_center=chassis, slot=1, group=group, credential=credential)
    obj_id = {"hypervisor": host.pk, "bladecenter": chassis.pk, "nodegroup": group.pk, "credential": credential.pk}
    for url in (
        f"/admin/inventory/{model}/",
        f"/admin/inventory/{model}/add/",
        f"/admin/inventory/{model}/{obj_id[model]}/change/",
    ):
        assert admin_client.get(url).status_code == 200, url


def test_admin_edits_go_through_the_service_and_the_change_log(db, admin_client, make_host):
    host = make_host(name="h1", tags=["old"])
    form = {
        **{k: v for k, v in host_row(1).items() if v != ""},
        "name": "h1",
        "cpus": 20,
        "tags": "new, gpu",
        "driver": "sim",
        "uri": "",
    }
    response = admin_client.post(f"/admin/inventory/hypervisor/{host.pk}/change/", form)
    assert response.status_code == 302, response.content.decode()[:3000]
    host.refresh_from_db()
    assert host.cpus == 20 and sorted(t.name for t in host.tags.all()) == ["gpu", "new"]
    change = changelog.history(host)[0]
    assert change.actor == "admin" and change.changes["cpus"] == [16, 20]
    assert change.changes["tags"] == [["old"], ["gpu", "new"]]
    page = admin_client.get(f"/admin/inventory/hypervisor/{host.pk}/change/").content.decode()
    assert "change log" in page.lower() and "→" in page


def test_admin_state_actions_need_a_reason(db, admin_client, make_host):
    a, b = make_host(name="a"), make_host(name="b")
    url = "/admin/inventory/hypervisor/"
    admin_client.post(url, {"action": "drain", "_selected_action": [a.pk, b.pk], "reason": ""})
    assert set(Hypervisor.objects.values_list("state", flat=True)) == {"online"}
    admin_client.post(url, {"action": "drain", "_selected_action": [a.pk, b.pk], "reason": "rack work"})
    assert set(Hypervisor.objects.values_list("state", flat=True)) == {"drained"}
    assert changelog.history(a)[0].reason == "rack work"
    admin_client.post(url, {"action": "set_online", "_selected_action": [a.pk], "reason": "done"})
    assert Hypervisor.objects.get(pk=a.pk).state == "online"


def test_admin_import_previews_then_confirms(db, admin_client):
    upload = SimpleUploadedFile("hosts.csv", to_csv([host_row(1), host_row(2)]), content_type="text/csv")
    response = admin_client.post("/admin/inventory/hypervisor/import/", {"import_file": upload, "format": "0"})
    assert response.status_code == 200
    page = response.content.decode()
    assert "h00001" in page and not Hypervisor.objects.exists()
    confirm = response.context["confirm_form"]
    response = admin_client.post("/admin/inventory/hypervisor/process_import/", confirm.initial)
    assert response.status_code == 302
    assert Hypervisor.objects.count() == 2
    assert changelog.history(Hypervisor.objects.get(name="h00001"))[0].actor == "admin"


def test_admin_import_shows_row_errors_and_offers_no_confirm(db, admin_client):
    upload = SimpleUploadedFile("hosts.csv", to_csv([host_row(1), host_row(2, cpus="-3")]), content_type="text/csv")
    response = admin_client.post("/admin/inventory/hypervisor/import/", {"import_file": upload, "format": "0"})
    assert "must be a positive integer" in response.content.decode()
    assert "confirm_form" not in response.context and not Hypervisor.objects.exists()


@override_settings(INVENTORY_IMPORT_MAX_BYTES=40)
def test_admin_import_refuses_files_with_the_same_messages(db, admin_client):
    upload = SimpleUploadedFile("hosts.csv", to_csv([host_row(1)]), content_type="text/csv")
    response = admin_client.post("/admin/inventory/hypervisor/import/", {"import_file": upload, "format": "0"})
    assert "over the limit of 40 bytes" in response.content.decode()
    upload = SimpleUploadedFile("hosts.csv", b"", content_type="text/csv")
    response = admin_client.post("/admin/inventory/hypervisor/import/", {"import_file": upload, "format": "0"})
    assert response.status_code == 200 and not Hypervisor.objects.exists()


def test_admin_export_escapes_formulas(db, admin_client, make_host):
    host = make_host(name="h1")
    services.set_state(host, "drained", "=cmd|' /C calc'!A0", actor=TEST)
    response = admin_client.post(
        "/admin/inventory/hypervisor/export/",
        {"format": "0", "resource": "0", **{f"hypervisorresource_{c}": "on" for c in ("id", "name", "state_reason")}},
    )
    assert response.status_code == 200
    assert "'=cmd|' /C calc'!A0" in response.content.decode()


def test_admin_registration_form_previews_then_registers(db, admin_client, group):
    form = {
        "name": "bc4",
        "slot_count": 4,
        "first_slot": 1,
        "last_slot": 4,
        "hostname_pattern": "{chassis}-n{slot}",
        "first_address": "10.4.0.1",
        "driver": "sim",
        "uri_template": "",
        "group": "lab",
        "cpus": 8,
        "memory_mib": 8192,
        "disk_gib": 100,
        "cpu_ratio": 4,
        "memory_ratio": 1,
        "disk_ratio": 1,
        "tags": "x",
    }
    url = "/admin/inventory/bladecenter/register/"
    assert admin_client.get(url).status_code == 200
    preview = admin_client.post(url, {**form, "preview": "1"})
    page = preview.content.decode()
    assert "bc4-n4" in page and "10.4.0.4" in page and "Register 4 hypervisors" in page
    assert not BladeCenter.objects.exists()
    done = admin_client.post(url, {**form, "confirm": "1"})
    chassis = BladeCenter.objects.get(name="bc4")
    assert done.status_code == 302 and done["Location"] == f"/inventory/blade-centers/{chassis.pk}/"
    assert chassis.hypervisors.count() == 4
    again = admin_client.post(url, {**form, "preview": "1"}).content.decode()
    assert "already exists" in again


def test_admin_offers_no_delete_for_a_host_in_use(db, admin_client, make_host):
    host = make_host(name="busy")
    with services.IN_USE_CHECKERS.replaced(lambda hv: "VMs running"):
        assert admin_client.get(f"/admin/inventory/hypervisor/{host.pk}/delete/").status_code == 403
    assert Hypervisor.objects.filter(pk=host.pk).exists()
    with services.IN_USE_CHECKERS.replaced():
        response = admin_client.post(f"/admin/inventory/hypervisor/{host.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302 and not Hypervisor.objects.filter(name="busy").exists()
