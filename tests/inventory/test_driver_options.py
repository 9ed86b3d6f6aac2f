"""A host's driver_options are checked when saved, by every path (service, API, admin): an
unknown option, a domain type other than kvm/qemu, a CPU mode off the list (or a host mode
under software emulation), a network in none of its forms — each refused naming the option."""

import json

import pytest
from django.core.exceptions import ValidationError

from drivers.libvirt import options
from inventory import services
from inventory.models import Hypervisor
from tests.inventory.conftest import TEST, host_row

GOOD = {"domain_type": "qemu", "pool": "vms", "network": "bridge:br0", "cpu_mode": "none", "stop_timeout": 30}
BAD = [
    ({"pol": "vms"}, "pol is not a libvirt option"),
    ({"domain_type": "xen"}, "domain_type 'xen': one of kvm, qemu"),
    ({"domain_type": "test"}, "domain_type 'test': one of kvm, qemu"),
    ({"cpu_mode": "fastest"}, "cpu_mode 'fastest': one of host-model, host-passthrough, maximum, none or custom:"),
    ({"domain_type": "qemu", "cpu_mode": "host-model"}, "cpu_mode 'host-model' needs domain_type kvm"),
    ({"network": "my net"}, "network 'my net': a libvirt network name, bridge:<name>, or user"),
    ({"network": "bridge:"}, "network 'bridge:': bridge:<interface name>"),
    ({"network": "bridge:a-very-long-bridge-name"}, "bridge:<interface name>"),
    ({"pool": "<x>"}, "pool '<x>': not a storage pool name"),
    ({"stop_timeout": -1}, "stop_timeout -1: seconds, a positive number"),
    ({"shared_storage": "yes"}, "shared_storage 'yes': true or false"),
    ({"disk_cache": "fast"}, "disk_cache 'fast': one of none, writeback, writethrough, directsync, unsafe, default"),
]


def create(**fields):
    return services.create_hypervisor(
        actor=TEST, name="kvm01", address="10.0.0.1", driver="libvirt", cpus=4, memory_mib=4096, disk_gib=40, **fields
    )


def test_the_known_forms_are_accepted():
    assert options.errors(GOOD) == {}
    assert options.errors({"network": "user", "cpu_mode": "custom:qemu64", "domain_type": "kvm"}) == {}
    assert options.errors({"network": "default", "cpu_mode": "host-model"}) == {}
    assert options.errors({"domain_type": "qemu", "disk_cache": "default"}) == {}
    assert options.errors({"domain_type": "test"}, "test:///default") == {}


@pytest.mark.parametrize(("value", "message"), BAD)
def test_create_refuses_bad_options_on_the_field(db, value, message):
    with pytest.raises(ValidationError) as refused:
        create(driver_options=value)
    assert message in " ".join(refused.value.message_dict["driver_options"])
    assert not Hypervisor.objects.exists()


def test_update_refuses_them_and_keeps_the_old_options(db):
    host = create(driver_options=GOOD)
    with pytest.raises(ValidationError, match="domain_type 'xen'"):
        services.update_hypervisor(host, actor=TEST, driver_options={**GOOD, "domain_type": "xen"})
    assert Hypervisor.objects.get(pk=host.pk).driver_options == GOOD


def test_other_kinds_are_not_held_to_libvirt_options(db):
    host = services.create_hypervisor(
        actor=TEST,
        name="esx01",
        address="10.0.0.2",
        driver="vmware",
        cpus=4,
        memory_mib=4096,
        disk_gib=40,
        driver_options={"insecure": True},
    )
    assert host.driver_options == {"insecure": True}


def test_the_api_answers_400_with_the_field(db, api, admin_user):
    body = {
        "name": "kvm01",
        "address": "10.0.0.1",
        "driver": "libvirt",
        "cpus": 4,
        "memory_mib": 4096,
        "disk_gib": 40,
        "driver_options": {"domain_type": "xen", "cpu_mode": "fastest"},
    }
    response = api(admin_user).post("/api/v1/hypervisors/", body, format="json")
    assert response.status_code == 400, response.content
    text = json.dumps(response.json()["error"]["fields"]["driver_options"])
    assert "domain_type 'xen'" in text and "cpu_mode 'fastest'" in text


def test_the_admin_form_shows_the_error_on_the_field(db, client, admin_user):
    client.force_login(admin_user)
    form = {**{k: v for k, v in host_row(1).items() if v != ""}, "driver_options": json.dumps({"network": "a b"})}
    response = client.post("/admin/inventory/hypervisor/add/", form)
    assert response.status_code == 200
    assert "network &#x27;a b&#x27;: a libvirt network name" in response.content.decode()
    assert not Hypervisor.objects.exists()
