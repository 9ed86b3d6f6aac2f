"""The driver registry is the one table of driver kinds: everything else is derived from it."""

import pytest

from drivers import registry
from drivers.base import Invalid
from inventory.models import Credential, Hypervisor
from inventory.validators import uri_errors
from provisioning.models import ImageVariant


def test_model_choices_and_lookups_come_from_the_table():
    assert Hypervisor.Driver.choices == [(k.name, k.label) for k in registry.KINDS.values()]
    assert Hypervisor.Driver.SIM == "sim" and Hypervisor.Driver.LIBVIRT == "libvirt"
    assert {t for t, _ in ImageVariant.HV_TYPES} == {k.hypervisor_type for k in registry.KINDS.values()}
    assert Hypervisor.HV_TYPES == {"sim": "sim", "libvirt": "kvm", "vmware": "vmware"}
    assert Hypervisor.IMAGE_FORMATS == {"sim": None, "kvm": ("qcow2", "raw"), "vmware": ("vmdk", "template")}
    assert registry.names_text() == "sim, libvirt or vmware"


def test_uris_are_checked_and_derived_by_kind():
    assert uri_errors("qemu+ssh://root@kvm01/system", "libvirt") is None
    assert "does not suit the vmware driver (use http, https)" in uri_errors("qemu:///system", "vmware")
    assert "names no host" in uri_errors("https:///sdk", "vmware")
    host = Hypervisor(name="esx01", address="10.0.0.5", driver="vmware")
    assert host.connection_uri == "https://10.0.0.5/sdk"
    assert Hypervisor(name="s1", address="10.0.0.6", driver="sim").connection_uri == "sim://s1"


def test_an_unknown_kind_is_refused_naming_the_known_ones():
    with pytest.raises(Invalid, match=r"unknown driver 'xen' \(one of sim, libvirt, vmware\)"):
        registry.kind("xen")


@pytest.mark.django_db
def test_driver_for_passes_credentials_and_the_kinds_options(settings):
    settings.VCLMGR_DRIVER_OPTIONS = {"vmware": {"insecure": True}, "sim": {"delay": 0, "cpus": 1}}
    settings.VCLMGR_SIM_OPTIONS = {"memory_mib": 1024}
    login = Credential(name="vc", username="admin", endpoints=["https://10.0.0.5:443"])
    login.set_secret("s3cret")
    login.save()
    esx = Hypervisor.objects.create(
        name="esx01", address="10.0.0.5", driver="vmware", credential=login, cpus=8, memory_mib=8192, disk_gib=100
    )
    sim = Hypervisor.objects.create(name="sim-1", address="10.0.0.6", cpus=16, memory_mib=65536, disk_gib=1000)

    vmware = registry.driver_for(esx)
    simulated = registry.driver_for(sim)

    assert vmware.credentials == {"username": "admin", "password": "s3cret"} and vmware.options == {"insecure": True}
    # the host's own capacity wins over the kind's options; VCLMGR_SIM_OPTIONS wins over both
    assert simulated.options == {"delay": 0, "cpus": 16, "memory_mib": 1024, "disk_gib": 1000}
    assert registry.options_for("libvirt") == {}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], "expected a JSON object of driver kinds"),
        ({"xen": {}}, "unknown driver 'xen'"),
        ({"vmware": True}, "the options of vmware must be a JSON object"),
    ],
)
def test_driver_options_must_be_an_object_of_objects_by_kind(value, message):
    assert message in registry.options_errors(value)
    assert registry.options_errors({"vmware": {"insecure": True}, "libvirt": {}}) is None


def test_a_hosts_own_driver_options_win_over_the_kinds(settings, db):
    from drivers import registry
    from inventory.models import Hypervisor

    settings.VCLMGR_DRIVER_OPTIONS = {"libvirt": {"pool": "vms", "domain_type": "kvm"}}
    host = Hypervisor(
        name="kvm-1",
        address="10.0.0.1",
        driver="libvirt",
        uri="test:///default",
        cpus=4,
        memory_mib=4096,
        disk_gib=10,
        driver_options={"domain_type": "qemu"},
    )
    assert registry.driver_for(host).options == {"pool": "vms", "domain_type": "qemu"}
    host.driver_options = ["qemu"]
    with pytest.raises(registry.Invalid, match="driver_options must be a JSON object"):
        registry.driver_for(host)
