"""Private networks on the simulated hypervisor: kept in the database, members' fixed
addresses, and the refusals a real host would make."""

import dataclasses

import pytest

from drivers.base import Conflict, DriverError, NetworkSpec, NotFound, private_mac
from drivers.sim import services
from drivers.sim.driver import SimDriver
from drivers.sim.models import SimHost, SimNetwork, SimNIC

pytestmark = pytest.mark.django_db


def lan(*members):
    hosts = tuple((name, private_mac(key, "env12-lan")) for name, key in members)
    return NetworkSpec("env12-lan", "10.201.0.0/24", hosts)


def member(peer, key, *networks, driver=None):
    """The VM ``key`` made on ``driver`` (the source host) with a NIC on each of ``networks``."""
    driver = driver or peer.source
    driver.stage_image(peer.image)
    spec = peer.spec(key=key, private_networks=tuple((net, private_mac(key, net)) for net in networks))
    driver.create(spec)
    return spec


def test_members_get_their_fixed_addresses_and_others_the_rest_of_the_range(sim_peer):
    sim_peer.source.create_network(lan(("router", "vcl-2001"), ("client1", "vcl-2002")))

    member(sim_peer, "vcl-2002", "env12-lan")
    member(sim_peer, "vcl-2001", "env12-lan")
    member(sim_peer, "vcl-2003", "env12-lan")  # no fixed address: the first one after the members'

    addresses = {key: sim_peer.source.private_addresses(key) for key in ("vcl-2001", "vcl-2002", "vcl-2003")}
    assert addresses == {
        "vcl-2001": {"env12-lan": "10.201.0.2"},
        "vcl-2002": {"env12-lan": "10.201.0.3"},
        "vcl-2003": {"env12-lan": "10.201.0.4"},
    }


def test_networks_persist_per_host_and_list_shows_them(sim_peer):
    spec = lan(("router", "vcl-2001"))

    first = sim_peer.source.create_network(spec)

    assert first == sim_peer.source.create_network(spec)  # a retry
    assert SimDriver("sim://sim-a").list_networks() == [first]  # another driver instance sees it
    assert sim_peer.target.list_networks() == []
    assert SimNetwork.objects.get(host__name="sim-a").hosts == [["router", private_mac("vcl-2001", "env12-lan")]]


def test_another_spec_under_the_same_key_is_a_conflict(sim_peer):
    sim_peer.source.create_network(lan())

    with pytest.raises(Conflict) as caught:
        sim_peer.source.create_network(dataclasses.replace(lan(), cidr="10.202.0.0/24"))

    assert caught.value.permanent and sim_peer.source.list_networks()[0].cidr == "10.201.0.0/24"


def test_an_overlapping_range_on_the_same_host_is_a_conflict(sim_peer):
    sim_peer.source.create_network(lan())

    with pytest.raises(Conflict, match="overlaps env12-lan"):
        sim_peer.source.create_network(NetworkSpec("env13-lan", "10.201.0.128/25"))
    sim_peer.target.create_network(NetworkSpec("env13-lan", "10.201.0.128/25"))  # another host: its own bridge


def test_a_vm_on_a_network_its_host_lacks_is_refused_and_nothing_is_left(sim_peer):
    sim_peer.target.create_network(lan())

    with pytest.raises(NotFound, match="no private network env12-lan on sim-a") as caught:
        member(sim_peer, "vcl-2001", "env12-lan")

    assert caught.value.permanent
    assert sim_peer.source.list_vms() == [] and not SimNIC.objects.exists()


def test_a_network_in_use_is_not_deleted_until_its_vms_are_gone(sim_peer):
    sim_peer.source.create_network(lan())
    spec = member(sim_peer, "vcl-2001", "env12-lan")

    with pytest.raises(Conflict, match="still used by vcl-2001"):
        sim_peer.source.delete_network("env12-lan")

    sim_peer.source.destroy(spec.key)
    assert sim_peer.source.delete_network("env12-lan") is True
    assert sim_peer.source.delete_network("env12-lan") is False
    assert not SimNetwork.objects.exists()


def test_a_member_does_not_migrate_away_from_its_network(sim_peer):
    sim_peer.source.create_network(lan())
    sim_peer.target.create_network(lan())
    spec = member(sim_peer, "vcl-2001", "env12-lan")

    with pytest.raises(Conflict, match="share a host"):
        sim_peer.source.migrate(spec.key, sim_peer.target)

    assert [vm.key for vm in sim_peer.source.list_vms()] == [spec.key]


def test_a_retried_create_of_a_member_makes_one_nic(sim_peer):
    sim_peer.source.create_network(lan())
    spec = member(sim_peer, "vcl-2001", "env12-lan")

    sim_peer.source.create(spec)

    assert SimNIC.objects.filter(vm__key=spec.key).count() == 1


def test_a_network_of_a_full_range_refuses_one_more_nic(sim_peer):
    sim_peer.source.create_network(NetworkSpec("env1-lan", "10.9.9.0/29"))
    for n in range(5):  # .2 to .6
        member(sim_peer, f"vcl-{2100 + n}", "env1-lan")

    with pytest.raises(Conflict, match="no free address"):
        member(sim_peer, "vcl-2199", "env1-lan")


def test_deleting_a_host_takes_its_networks_and_members(sim_peer):
    sim_peer.source.create_network(lan())
    member(sim_peer, "vcl-2001", "env12-lan")

    SimHost.objects.filter(name="sim-a").delete()

    assert not SimNetwork.objects.exists() and not SimNIC.objects.exists()


def test_a_fault_can_be_injected_into_network_calls(sim_peer):
    services.set_fault("sim-a", "create_network", "fail")

    with pytest.raises(DriverError, match="injected failure"):
        sim_peer.source.create_network(lan())


def test_the_admin_shows_networks_and_their_members_read_only(sim_peer, admin_client):
    sim_peer.source.create_network(lan(("router", "vcl-2001")))
    member(sim_peer, "vcl-2001", "env12-lan")
    net = SimNetwork.objects.get()

    listing = admin_client.get("/admin/simhv/simnetwork/")
    page = admin_client.get(f"/admin/simhv/simnetwork/{net.pk}/change/")

    assert listing.status_code == page.status_code == 200
    assert b"env12-lan" in listing.content and b"10.201.0.2" in page.content
    assert admin_client.post(f"/admin/simhv/simnetwork/{net.pk}/delete/", {"post": "yes"}).status_code == 403
    assert SimNetwork.objects.exists()


def test_a_network_on_an_overlay_is_one_address_space_across_its_hosts(sim_peer):
    spec = dataclasses.replace(lan(("router", "vcl-2001")), overlay="vxlan-lab", segment=7)
    sim_peer.source.create_network(spec)
    sim_peer.target.create_network(dataclasses.replace(spec, home=False))

    member(sim_peer, "vcl-2001", "env12-lan")  # the member's fixed address, on the home host
    member(sim_peer, "vcl-2003", "env12-lan", driver=sim_peer.target)  # a stranger: the next free one
    member(sim_peer, "vcl-2004", "env12-lan")  # and the next: the other host's lease counts

    assert sim_peer.source.private_addresses("vcl-2001") == {"env12-lan": "10.201.0.2"}
    assert sim_peer.target.private_addresses("vcl-2003") == {"env12-lan": "10.201.0.3"}
    assert sim_peer.source.private_addresses("vcl-2004") == {"env12-lan": "10.201.0.4"}
    rows = {n.host.name: (n.overlay, n.segment, n.home) for n in SimNetwork.objects.filter(key="env12-lan")}
    assert rows == {"sim-a": ("vxlan-lab", 7, True), "sim-b": ("vxlan-lab", 7, False)}
