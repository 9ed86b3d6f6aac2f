"""Inventory pages: hypervisor list with filters, host page, blade centers drawn as chassis."""

import pytest

from inventory import services
from inventory.models import Hypervisor
from tests.inventory.conftest import TEST

PAGES = ["/inventory/", "/inventory/blade-centers/"]


@pytest.fixture
def staff_client(client, admin_user):
    client.force_login(admin_user)
    return client


@pytest.mark.parametrize("url", PAGES)
def test_pages_need_a_staff_login(db, client, alice, url):
    assert client.get(url).status_code == 302  # to the login page
    client.force_login(alice)
    assert client.get(url).status_code == 403


def test_host_and_chassis_pages_are_staff_only(db, client, alice, make_host, chassis):
    host = make_host(blade_center=chassis, slot=1)
    client.force_login(alice)
    for url in (f"/inventory/hypervisors/{host.pk}/", f"/inventory/blade-centers/{chassis.pk}/"):
        assert client.get(url).status_code == 403
    response = client.post(f"/inventory/hypervisors/{host.pk}/state/", {"state": "offline", "reason": "x"})
    assert response.status_code == 403 and Hypervisor.objects.get(pk=host.pk).state == "online"


def test_the_list_filters_and_shows_capacity(db, staff_client, make_host, group):
    make_host(name="gpu-host", group=group, tags=["gpu"], cpus=10, reserved_cpus=2)
    make_host(name="plain-host")
    page = staff_client.get("/inventory/?group=lab").content.decode()
    assert "gpu-host" in page and "plain-host" not in page
    assert ">32<" in page  # (10 - 2) × 4.0 usable vCPUs
    page = staff_client.get("/inventory/?tag=gpu&state=online").content.decode()
    assert "gpu-host" in page and "plain-host" not in page
    page = staff_client.get("/inventory/?q=plain").content.decode()
    assert "plain-host" in page and "gpu-host" not in page
    assert staff_client.get("/inventory/?group=nope").status_code == 200  # invalid filter: shown, not a crash


def test_the_list_runs_a_fixed_number_of_queries(db, staff_client, make_host, group, django_assert_max_num_queries):
    for _ in range(40):
        make_host(group=group, tags=["a", "b"])
    with django_assert_max_num_queries(12):
        assert staff_client.get("/inventory/").status_code == 200


def test_the_host_page_shows_the_change_log_and_changes_state(db, staff_client, make_host):
    host = make_host(name="h1")
    services.update_hypervisor(host, actor=TEST, cpus=99, reason="bigger box")
    page = staff_client.get(f"/inventory/hypervisors/{host.pk}/").content.decode()
    assert "Change log" in page and "bigger box" in page and f"hypervisor.{host.pk}" in page
    response = staff_client.post(f"/inventory/hypervisors/{host.pk}/state/", {"state": "drained", "reason": "disk"})
    assert response.status_code == 302
    host.refresh_from_db()
    assert (host.state, host.state_changed_by) == ("drained", "admin")
    staff_client.post(f"/inventory/hypervisors/{host.pk}/state/", {"state": "offline", "reason": ""})
    assert Hypervisor.objects.get(pk=host.pk).state == "drained"


def test_the_chassis_page_draws_every_slot_and_subscribes_to_its_topic(db, staff_client, make_host, chassis):
    make_host(name="s2", blade_center=chassis, slot=2)
    drained = make_host(name="s5", blade_center=chassis, slot=5)
    services.set_state(drained, "drained", "x", actor=TEST)
    page = staff_client.get(f"/inventory/blade-centers/{chassis.pk}/").content.decode()
    assert page.count('<li class="slot ') == 16
    assert 'class="slot online" data-slot="2"' in page and 'class="slot drained" data-slot="5"' in page
    assert 'class="slot empty" data-slot="1"' in page
    assert f'data-topic="bladecenter.{chassis.pk}"' in page and "js/pages/bladecenter_detail.js" in page
    listing = staff_client.get("/inventory/blade-centers/").content.decode()
    assert "bc1" in listing


def test_the_list_pages_and_keeps_the_filter(db, staff_client, make_host, group):
    from inventory.models import Hypervisor

    Hypervisor.objects.bulk_create(
        Hypervisor(
            name=f"h{n:03d}", address=f"10.9.0.{n}", driver="sim", cpus=4, memory_mib=4096, disk_gib=50, group=group
        )
        for n in range(1, 106)
    )
    first = staff_client.get("/inventory/?group=lab").content.decode()
    assert "page 1 of 2" in first and 'href="?group=lab&amp;page=2"' in first and "‹ previous" not in first
    second = staff_client.get("/inventory/?group=lab&page=2").content.decode()
    assert "h105" in second and "h001" not in second and 'href="?group=lab&amp;page=1"' in second
