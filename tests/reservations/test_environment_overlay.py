"""Environments over an overlay network: members of one private network may be placed on
several hosts the operator joined with one overlay (and on no hosts that are not), the network
made on each of them on one segment of the overlay, and removed from all of them at the end."""

from datetime import timedelta

from capacity.models import Allocation
from drivers.sim.models import SimNetwork, SimNIC, SimVM
from provisioning.models import PrivateNetwork
from reservations import services
from tests.environments.conftest import debian, make_template, member, router_image  # noqa: F401 (fixtures)
from tests.reservations.test_environments import lab, machines  # noqa: F401 (fixture)

H = timedelta(hours=1)


def test_a_network_too_big_for_one_host_spreads_over_an_overlay(make_host, lab, alice, sync_jobs):  # noqa: F811
    one = make_host("one", cpus=16, memory_mib=1536, overlay="lab-ovl")  # the router, or the two clients
    two = make_host("two", cpus=16, memory_mib=1536, overlay="lab-ovl")
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    sync_jobs.drain()
    rows = machines(head)
    assert {n: r.status for n, r in rows.items()} == dict.fromkeys(rows, "ready"), {n: r.error for n, r in rows.items()}
    assert {r.allocation.host.name for r in rows.values()} == {"one", "two"}
    # Each network is on the hosts of its members, one segment of the overlay, one home.
    for name in ("left", "right"):
        nets = PrivateNetwork.objects.filter(key=f"env{head.pk}-{name}")
        hosts = {n.host.name for n in nets}
        assert hosts == {rows[h].allocation.host.name for h in nets[0].members}
        assert {(n.overlay, n.segment) for n in nets} == {("lab-ovl", nets[0].segment)}
        assert [n.home for n in nets].count(True) == 1
    segments = {n.segment for n in PrivateNetwork.objects.all()}
    assert len(segments) == 2  # the two networks on different segments
    # Every member has its fixed address on each of its networks, whichever host it is on.
    addresses = {(nic.vm.key, nic.network.key): nic.address for nic in SimNIC.objects.select_related("vm", "network")}
    assert len(addresses) == 4 and len(set(addresses.values())) == 4

    services.end(head, actor=alice)
    sync_jobs.drain()
    assert not SimVM.objects.exists() and not SimNetwork.objects.exists()
    assert not Allocation.objects.filter(host__in=[one, two], released__isnull=True).exists()


def test_hosts_of_different_overlays_or_none_keep_a_network_on_one_host(make_host, lab, alice):  # noqa: F811
    import pytest
    from django.core.exceptions import ValidationError

    make_host("one", cpus=16, memory_mib=1536, overlay="red")
    make_host("two", cpus=16, memory_mib=1536, overlay="blue")
    make_host("three", cpus=16, memory_mib=1536)
    with pytest.raises(ValidationError) as refused:
        services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    assert "must share a host, or hosts of one overlay network," in str(refused.value)
    assert not PrivateNetwork.objects.exists() and not Allocation.objects.filter(released__isnull=True).exists()


def test_a_spread_group_that_fails_on_one_host_is_placed_again_off_it(make_host, lab, alice, sync_jobs):  # noqa: F811
    from drivers.sim import services as sim

    hosts = [make_host(f"h{i}", cpus=16, memory_mib=1536, overlay="lab-ovl") for i in range(3)]
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    router_host = machines(head)["router"].allocation.host
    sim.set_fault(router_host.name, "start", "fail_once")  # the first to boot there fails
    sync_jobs.drain()
    rows = machines(head)
    assert {n: r.status for n, r in rows.items()} == dict.fromkeys(rows, "ready"), {n: r.error for n, r in rows.items()}
    used = {r.allocation.host_id for r in rows.values()}
    failed = {h for r in rows.values() for h in r.failed_hosts}
    assert len(failed) == 1 and not used & failed  # nothing of it on the host that failed
    assert not SimVM.objects.filter(host__name__in=[h.name for h in hosts if h.pk in failed]).exists()
    assert set(SimNetwork.objects.values_list("key", flat=True)) == {f"env{head.pk}r2-left", f"env{head.pk}r2-right"}
    live = PrivateNetwork.objects.filter(removed__isnull=True)
    assert {n.host_id for n in live} <= used and {n.key for n in live} == set(
        SimNetwork.objects.values_list("key", flat=True)
    )


def test_an_environment_ended_before_its_machines_were_built_leaves_no_network_recorded(
    make_host,
    lab,  # noqa: F811
    alice,
    sync_jobs,
):
    make_host("one", cpus=16, memory_mib=1536, overlay="lab-ovl")
    make_host("two", cpus=16, memory_mib=1536, overlay="lab-ovl")
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    assert PrivateNetwork.objects.filter(removed__isnull=True).count() == 4  # two networks, each on both hosts
    services.end(head, actor=alice)  # before any build ran: no machine ever reached its host
    sync_jobs.drain()
    assert not PrivateNetwork.objects.filter(removed__isnull=True).exists()  # segments and ranges free again
    assert not SimVM.objects.exists() and not SimNetwork.objects.exists()


def test_a_retry_may_take_the_room_its_own_group_held_on_a_host_it_keeps(make_host, lab, alice, sync_jobs):  # noqa: F811
    from capacity.snapshot import snapshot
    from drivers.sim import services as sim

    make_host("one", cpus=16, memory_mib=1536, overlay="lab-ovl")  # the router, or the two clients
    make_host("two", cpus=16, memory_mib=1536, overlay="lab-ovl")
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    router_host = machines(head)["router"].allocation.host
    clients_host = machines(head)["client"].allocation.host
    make_host("three", cpus=16, memory_mib=1280, overlay="lab-ovl")  # room for the router, or the two clients
    snapshot.expire()  # (placement looks at hosts again at most once a second)
    sim.set_fault(router_host.name, "start", "fail_once")
    sync_jobs.drain()
    # The group (all three: the router joins them) moves off the router's host, over "three"
    # and the clients' host, in the room their own old claims held there (without it, the
    # clients' host has room for one client only and the environment fails).
    rows = machines(head)
    assert {n: r.status for n, r in rows.items()} == dict.fromkeys(rows, "ready"), {n: r.error for n, r in rows.items()}
    assert {r.allocation.host.name for r in rows.values()} == {"three", clients_host.name}
    assert not Allocation.objects.filter(host=router_host, released__isnull=True).exists()
    assert Allocation.objects.filter(released__isnull=True).count() == 3
