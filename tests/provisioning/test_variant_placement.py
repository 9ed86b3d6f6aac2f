"""A VM of an image goes only to hosts whose hypervisor type has a variant of it: a simulated
host serves simulated variants, not a real image it would only pretend to run (unless the
simulator is told to run any image, ``VCLMGR_SIM_OPTIONS={"any_image": true}``). A refusal
names the image and the hosts it has no variant for."""

from datetime import timedelta

import pytest
from django.utils import timezone

from capacity import services as capacity
from drivers import registry
from provisioning import services
from provisioning.models import VM
from tests.conftest import TEST
from tests.provisioning.conftest import sim_image


@pytest.fixture
def blades(make_host):
    """Sixteen big simulated blades: balanced placement would pick any of them first."""
    return [make_host(f"bc1-s{n:02d}", cpus=32, memory_mib=131072, disk_gib=2000) for n in range(1, 17)]


@pytest.fixture
def kvm_local(make_host):
    return make_host("kvm-local", driver="libvirt", uri="qemu:///system", cpus=8, memory_mib=16384, disk_gib=100)


@pytest.fixture
def guest(db):
    image = services.create_image(
        actor=TEST,
        name="debian-guest",
        os="Debian 12 (test guest)",
        min_memory_mib=128,
        default_memory_mib=256,
        min_disk_gib=0,
        default_disk_gib=1,
    )
    services.add_variant(image, actor=TEST, hypervisor_type="kvm", format="qcow2", location="/srv/guest.qcow2")
    return image


def claim(image, actor=TEST):
    start = timezone.now()
    size = services.size_for(image)
    demand = services.demand_for(image, size, start=start, end=start + timedelta(hours=1), purpose="test")
    return capacity.claim(demand, actor=actor)


def test_a_kvm_only_image_lands_only_on_the_kvm_host_beside_simulated_blades(blades, kvm_local, guest):
    hosts = {claim(guest).host.name for _ in range(10)}
    assert hosts == {"kvm-local"}


def test_it_refuses_saying_the_image_has_no_variant_for_simulated_hosts(blades, kvm_local, guest):
    kvm_local.state = "drained"
    kvm_local.save()
    with pytest.raises(capacity.NoCapacity) as refused:
        claim(guest)
    assert refused.value.result.reasons == {"wrong_hypervisor": 16, "drained": 1}
    assert "debian-guest has no variant for simulated hosts" in str(refused.value)


def test_a_create_on_simulated_hosts_only_fails_with_the_reason(blades, guest, alice, sync_jobs):
    vm, job = services.request_vm(actor=alice, owner=alice, image=guest)
    sync_jobs.drain()
    vm = VM.objects.get(pk=vm.pk)
    assert vm.state == "failed" and "debian-guest has no variant for simulated hosts" in vm.error
    assert vm.host is None


def test_an_image_with_a_simulated_variant_still_runs_on_simulated_hosts(blades, kvm_local):
    image = sim_image("debian-12", "Debian 12")
    assert claim(image).host.name.startswith("bc1-")


def test_an_image_with_both_variants_may_go_to_either(blades, kvm_local, guest):
    services.add_variant(guest, actor=TEST, hypervisor_type="sim", format="sim", location="sim://library/guest")
    usable = services.usable(None, guest)
    assert usable.variant_on("sim") == guest.variants.get(hypervisor_type="sim").pk
    assert usable.variant_on("kvm") == guest.variants.get(hypervisor_type="kvm").pk
    assert claim(guest).host.name.startswith("bc1-")  # the blades are emptier


def test_a_simulated_host_serves_no_other_types_variant_by_default(settings):
    settings.VCLMGR_SIM_OPTIONS = {}
    assert services.pick_variant({"kvm": 7}, "sim") is None
    assert services.pick_variant({"kvm": 7}, "vmware") is None
    assert not registry.serves("sim", {"kvm"}) and registry.serves("kvm", {"kvm"})
    settings.VCLMGR_SIM_OPTIONS = {"any_image": "yes"}  # only a JSON true turns it on
    assert services.pick_variant({"kvm": 7}, "sim") is None


def test_the_simulator_told_to_run_any_image_takes_it_with_its_first_variant(settings, blades, guest, alice, sync_jobs):
    settings.VCLMGR_SIM_OPTIONS = {"any_image": True}
    assert services.pick_variant({"kvm": 7, "vmware": 8}, "sim") == 7
    assert services.pick_variant({"kvm": 7}, "vmware") is None  # real hypervisors never
    assert registry.serving_types({"kvm"}) == {"kvm", "sim"} and registry.serving_types(set()) == set()
    vm, job = services.request_vm(actor=alice, owner=alice, image=guest)
    sync_jobs.drain()
    vm = VM.objects.get(pk=vm.pk)
    assert vm.state == "running", vm.error
    assert vm.host.driver == "sim" and vm.variant.hypervisor_type == "kvm"
