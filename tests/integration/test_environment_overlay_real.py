"""An environment whose private network spans two real KVM hosts (``tests/twohosts.py``) of one
overlay: each host has room for one machine only, so its two machines are placed one on each;
vclmgr makes the network on both (the gateway, DHCP and DNS on the home host only), and the
operator's libvirt network hook, the one vclmgr ships (``deploy/libvirt-network-hook``),
joins the two bridges with a VXLAN over the hosts' own segment. The user logs into the entry
machine over SSH with the reservation's login and from it reaches the machine on the other host
by name; that machine got its fixed address and resolves names from the home host's dnsmasq
across the overlay; neither routes anything outside the range through the private network;
ending it leaves no domain, volume, network or VXLAN on either host.

Network rule: everything is inside the hosts' two network namespaces, which the fixture
made: the guests' primary NICs on the segment both hosts see, the VXLAN between the hosts'
addresses on it. The one address outside the environment a guest is asked to reach is
192.0.2.1 (TEST-NET-1), through the private NIC only.
"""

import ipaddress
import re
import time
from datetime import timedelta

import libvirt
import pytest

from capacity.models import Allocation
from drivers import registry as drivers
from drivers.libvirt import agent, netxml
from environments import services as environments
from provisioning.models import PrivateNetwork
from reservations import services
from reservations.models import Reservation
from tests import realvm, twohosts
from tests.environments.conftest import member
from tests.integration.conftest import started_two_hosts
from tests.integration.test_environment_real import private_nic
from tests.jobs.conftest import sync_jobs  # noqa: F401 (fixture)
from tests.jobs.helpers import wait_until
from tests.localkvm_inventory import kvm_guest_image, two_kvm_hosts
from tools.localkvm import ROOT

pytestmark = pytest.mark.slow
HOOK = ROOT / "deploy" / "libvirt-network-hook"
AGENT_SECONDS = 300  # each build waits for its guest's agent: a boot under emulation on shared cores
CIDR = "192.168.77.0/29"  # inside the hosts' namespaces only: no interface of this machine matters
UNDERLAY_MTU = 1550  # the guests' 1500-byte frames and VXLAN's 50 bytes around them
MEMBER_MIB, HOST_MIB = 256, 384  # room for one machine on each host


def overlay_hook(host, peer):
    """The shipped hook, set for ``host``: its address on the segment, and its one peer."""
    text, n = re.subn(r"^LOCAL=.*$", f"LOCAL={host.address}", HOOK.read_text(), count=1, flags=re.MULTILINE)
    text, m = re.subn(r"^PEERS=.*$", f'PEERS="{peer.address}"', text, count=1, flags=re.MULTILINE)
    assert n == m == 1, "the hook's LOCAL= and PEERS= lines moved"
    return {"network": text}


@pytest.fixture(scope="module")
def two_hosts():
    with started_two_hosts(hooks=overlay_hook, mtu=UNDERLAY_MTU) as hosts:
        yield hosts


def machines(head):
    rows = Reservation.objects.filter(pk=head.pk) | Reservation.objects.filter(head=head)
    return {r.hostname: r for r in rows.select_related("vm", "allocation__host")}


def links(host, kind):
    """``host``'s interfaces of ``kind`` (``bridge``, ``vxlan``), each as ``ip -d -j`` gives it."""
    return [
        link
        for link in realvm.ip_json("-n", host.netns, "-d", "link", "show", "type", kind)
        if link["ifname"] != twohosts.BRIDGE
    ]


def run(client, command):
    """``command`` on the machine ``client`` is logged into: (exit status, output, errors)."""
    _, stdout, stderr = client.exec_command(command, timeout=60)
    out = stdout.read().decode()
    return stdout.channel.recv_exit_status(), out, stderr.read().decode()


def test_an_environment_spread_over_two_hosts_of_an_overlay_is_one_network(
    two_hosts,
    alice,
    guest_image,
    sync_jobs,  # noqa: F811
):
    two_kvm_hosts(two_hosts, shared=False, overlay="lab", memory_mib=HOST_MIB)
    image = kvm_guest_image(guest_image, "guest-debian", readiness="agent", ready_timeout=AGENT_SECONDS)
    members = [
        member("entry", image, "lan", entry=True, memory_mib=MEMBER_MIB),
        member("peer", image, "lan", memory_mib=MEMBER_MIB),
    ]
    template = environments.create_template(
        actor=alice, name="pair", members=members, networks=[{"name": "lan", "cidr": CIDR}]
    )

    started = time.monotonic()
    head = services.reserve_environment(alice, template, actor=alice, duration=timedelta(hours=1))
    sync_jobs.drain(budget=AGENT_SECONDS)
    reserve_to_ready = time.monotonic() - started
    rows = machines(head)
    assert {n: r.status for n, r in rows.items()} == dict.fromkeys(("entry", "peer"), "ready"), {
        n: r.error for n, r in rows.items()
    }
    on = {name: r.allocation.host for name, r in rows.items()}
    assert {h.name for h in on.values()} == {"host-a", "host-b"}
    nets = {n.host.name: n for n in PrivateNetwork.objects.filter(key=f"env{head.pk}-lan").select_related("host")}
    assert set(nets) == {"host-a", "host-b"}
    [segment] = {(n.overlay, n.segment) for n in nets.values()}
    assert segment[0] == "lab" and [n.home for n in nets.values()].count(True) == 1
    home = next(n.host.name for n in nets.values() if n.home)

    # The hook joined the network's bridge on each host to the VXLAN of its segment.
    bridge = netxml.bridge_name(f"env{head.pk}-lan")
    for host in two_hosts.hosts:
        [vx] = links(host, "vxlan")
        assert (vx["ifname"], vx["master"]) == (f"vx{segment[1]}", bridge), vx
        assert vx["linkinfo"]["info_data"]["id"] == segment[1]

    # The user logs into the entry machine with the reservation's login …
    details = services.connection(Reservation.objects.get(pk=head.pk))
    assert details["protocol"] == "ssh" and details["port"] == 22 and details["password"]
    assert details["address"].startswith(f"{twohosts.NET}."), details  # its primary NIC, not its private one
    client = two_hosts.ssh(two_hosts.a, details["address"], details["user"], password=details["password"])
    try:
        assert run(client, "hostname")[:2] == (0, "entry\n")
        # … and from it reaches the machine on the other host by name, with the same login, over
        # the overlay; from there the entry's name, resolved by the home host's DNS, leads back.
        # Each hop says where its connection came from and went to (a ping needs root here).
        back = f'DROPBEAR_PASSWORD={details["password"]} dbclient -y -y entry "hostname; echo \\$SSH_CONNECTION"'
        there = f"hostname; echo $SSH_CONNECTION; {back}"
        hop = f"DROPBEAR_PASSWORD={details['password']} dbclient -y -y peer '{there}'"
        last = {}

        def hopped():
            status, out, last["errors"] = run(client, hop)
            return out if status == 0 else None  # a lease may come a moment after the agent

        try:
            out = wait_until(hopped, 90, "the other host's machine by name from the entry machine", interval=1)
        except AssertionError as exc:
            _, state, _ = run(client, "cat /etc/resolv.conf; ip -4 -o addr; ip route")
            raise AssertionError(f"{exc}\n{last.get('errors')}\n--- the entry machine ---\n{state}") from None
        lines = out.splitlines()
        assert lines[0] == "peer" and lines[2] == "entry", out
        (there_from, _, there_to, _), (back_from, _, back_to, _) = lines[1].split(), lines[3].split()
        addresses = {"entry": there_from, "peer": there_to}
        assert (back_from, back_to) == (addresses["peer"], addresses["entry"]), out
        assert all(ipaddress.ip_address(a) in ipaddress.ip_network(CIDR) for a in addresses.values()), out

        # No way out through the private network, on either host's machine: only the range is
        # routed to its NIC, and a ping bound to that NIC for an address outside finds no one.
        for name, row in rows.items():
            dom = drivers.driver_for(on[name]).conn.lookupByName(row.vm.key)
            status, out = agent.run(dom, ["/bin/sh", "-c", "ip -4 -o addr"])
            nic = private_nic(out.decode(), CIDR)
            status, routes = agent.run(dom, ["/bin/sh", "-c", "ip route"])
            routes = routes.decode()
            assert [r.split()[0] for r in routes.splitlines() if f" dev {nic} " in f"{r} "] == [CIDR], routes
            status, out = agent.run(dom, ["/bin/ping", "-c1", "-W2", "-I", nic, "192.0.2.1"])
            assert status != 0 and b"0 packets received" in out, (name, out)
    finally:
        client.close()

    services.end(Reservation.objects.get(pk=head.pk), actor=alice)
    sync_jobs.drain(budget=AGENT_SECONDS)
    rows = machines(head)
    assert {(r.status, r.vm.state) for r in rows.values()} == {("ended", "destroyed")}, {
        n: (r.status, r.vm.state, r.vm.error) for n, r in rows.items()
    }
    keys = {r.vm.key for r in rows.values()}
    for host in two_hosts.hosts:
        conn = libvirt.open(host.uri)
        try:
            assert not keys & {d.name() for d in conn.listAllDomains()}
            pool = conn.storagePoolLookupByName(twohosts.LOCAL_POOL)
            pool.refresh(0)
            assert not [v for v in pool.listAllVolumes() if any(v.name().startswith(k) for k in keys)]
            assert not conn.listAllNetworks()
        finally:
            conn.close()
        assert links(host, "bridge") == [] and links(host, "vxlan") == [], host.name  # the hook's teardown
    assert not PrivateNetwork.objects.filter(removed__isnull=True).exists()
    assert not Allocation.objects.filter(released__isnull=True).exists()
    where = f"entry on {on['entry'].name}, peer on {on['peer'].name}, home {home}, segment {segment[1]}"
    print(f"\nreserve→ready, two machines built one after the other: {reserve_to_ready:.1f} s ({where})")
