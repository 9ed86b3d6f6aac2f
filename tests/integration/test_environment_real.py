"""An environment of three real QEMU guests on one private network of the tests' own libvirtd
(registered as a ``libvirt`` host, as in test_reserve_real_vm.py): reserved as one, built by a
real worker process, ready together; the user logs into the entry machine over SSH with the
reservation's login and from it reaches the other two by hostname; the private network gives
no way out; ending the head leaves no domain, volume or network.

Network rule: each guest's user-mode NIC has ``restrict=on`` and one forward from 127.0.0.1;
the private network is isolated (no ``<forward>``) on a range no interface of this machine
uses. The one address outside the environment a guest is asked to reach is 192.0.2.1
(TEST-NET-1), through the private NIC only, which has no route: all that is sent is an ARP
request on the isolated bridge.
"""

import ipaddress
import time
from datetime import timedelta

import pytest

from capacity.models import Allocation
from drivers.libvirt import agent, netxml
from environments import services as environments
from provisioning.models import PrivateNetwork
from reservations import services
from reservations.models import Reservation
from tests import processes, realvm
from tests.environments.conftest import member
from tests.integration import test_reserve_real_vm as reserve_real
from tests.jobs.helpers import wait_until
from tests.localkvm_inventory import kvm_guest_image
from tests.realvm import ssh_run

pytestmark = pytest.mark.slow
kvm_host, vm_ids = reserve_real.kvm_host, reserve_real.vm_ids  # the reservation tests' host and VM ids
READY_TIMEOUT = 400  # s: three guests boot at once under emulation, on cores a test run may share
MACHINES = ("gateway", "client", "server")


@pytest.fixture
def trio(alice, guest_image):
    """Alice's template: the entry machine and two more on one private network, 256 MiB each."""
    image = kvm_guest_image(guest_image, "guest-debian")
    cidr = realvm.unused_range()
    members = [member(name, image, "lan", entry=name == "gateway", memory_mib=256) for name in MACHINES]
    template = environments.create_template(
        actor=alice, name="trio", members=members, networks=[{"name": "lan", "cidr": cidr}]
    )
    return template, cidr


@pytest.fixture
def env_worker(transactional_db, tmp_path, kvm_host, libvirt_conn):
    """A worker cluster building the three at once; on the way out (a failed test too) this
    test's domains and then its private networks are removed from the shared libvirtd."""
    _host, pool = kvm_host
    child = processes.start_worker(tmp_path, workers=3)
    try:
        yield child
    finally:
        child.stop()
        realvm.remove_domains_on(libvirt_conn, [pool.path])
        for key in {n.key for n in PrivateNetwork.objects.all()}:
            realvm.remove_network(libvirt_conn, key)


def machines(head):
    rows = Reservation.objects.filter(pk=head.pk) | Reservation.objects.filter(head=head)
    return {r.hostname: r for r in rows.select_related("vm")}


def wait_ready(head, worker):
    def ready():
        fresh = Reservation.objects.get(pk=head.pk)
        if fresh.status in ("failed", "ended"):
            raise AssertionError(f"environment {head.pk} {fresh.status}: {fresh.error}\n{worker.output()[-3000:]}")
        return fresh if fresh.status == "ready" else None

    return wait_until(ready, READY_TIMEOUT, f"environment {head.pk} to be ready", worker, interval=0.3)


def wait_torn_down(head, worker):
    def torn_down():
        return all((r.status, r.vm.state) == ("ended", "destroyed") for r in machines(head).values())

    try:
        wait_until(torn_down, 120, "every machine's teardown", worker, interval=0.3)
    except AssertionError as exc:
        states = [(r.hostname, r.status, r.vm.state, r.vm.error) for r in machines(head).values()]
        raise AssertionError(f"{states}\n{exc}") from None


def private_nic(addresses, cidr):
    """The interface of ``ip -4 -o addr`` output with an address in ``cidr``."""
    network = ipaddress.ip_network(cidr)
    for line in addresses.splitlines():
        fields = line.split()
        if "inet" in fields and ipaddress.ip_interface(fields[fields.index("inet") + 1]).ip in network:
            return fields[1]
    raise AssertionError(f"no address in {cidr}:\n{addresses}")


def volumes(pool):
    pool.pool.refresh(0)
    return [v.name() for v in pool.pool.listAllVolumes()]


def test_three_guests_reach_one_another_by_name_and_nothing_else(alice, kvm_host, trio, env_worker, libvirt_conn):
    _host, pool = kvm_host
    template, cidr = trio

    started = time.monotonic()
    head = services.reserve_environment(alice, template, actor=alice, duration=timedelta(hours=1))
    head = wait_ready(head, env_worker)
    reserve_to_ready = time.monotonic() - started
    rows = machines(head)
    assert {name: r.status for name, r in rows.items()} == dict.fromkeys(MACHINES, "ready")
    [network] = PrivateNetwork.objects.filter(key=f"env{head.pk}-lan")
    assert network.cidr == cidr and network.removed is None

    details = services.connection(head)
    assert details["protocol"] == "ssh" and details["address"] == "127.0.0.1" and details["password"]

    def on_entry(command):
        return ssh_run(details["port"], details["user"], command, host=details["address"], password=details["password"])

    # On the entry machine by the reservation's login; on from it to the others by name, with
    # the same login (an environment has one), over the private network.
    hops = "; ".join(f"DROPBEAR_PASSWORD='{details['password']}' dbclient -y -y {h} hostname" for h in MACHINES[1:])

    def hopped():
        # A machine is ready once its login answers; its lease on the private network (whose
        # DHCP server also answers the names) may come a moment later on a loaded host.
        try:
            return on_entry(f"hostname; {hops}")
        except AssertionError:  # a hop refused: not reachable yet
            return None

    out = wait_until(hopped, timeout=60, what="the other machines by name from the entry machine", interval=1)
    assert out.split() == list(MACHINES), out

    # No way out through the private network: its lease gave no route but its own range (the
    # only default route, if any, is user-mode networking's), so the guest sends nothing for an
    # address outside the range out of that NIC.
    nic = private_nic(on_entry("ip -4 -o addr"), cidr)
    routes = on_entry("ip route")
    assert [r.split()[0] for r in routes.splitlines() if f" dev {nic} " in f"{r} "] == [cidr], routes
    assert f"dev {nic}" not in on_entry("ip route get 192.0.2.1 2>&1 || true")
    # Even told to (as root, through the guest agent): a ping bound to the private NIC finds no
    # one. Bound to a NIC without a route, the kernel takes the address as on that link: all it
    # sends is an ARP request on the isolated bridge, which nobody answers.
    dom = libvirt_conn.lookupByName(rows["gateway"].vm.key)
    status, out = agent.run(dom, ["/bin/ping", "-c1", "-W2", "-I", nic, "192.0.2.1"])
    assert status != 0 and b"0 packets received" in out, out

    services.end(Reservation.objects.get(pk=head.pk), actor=alice)
    wait_torn_down(head, env_worker)
    keys = {r.vm.key for r in rows.values()}
    assert not keys & {d.name() for d in libvirt_conn.listAllDomains()}
    assert not [v for v in volumes(pool) if any(v.startswith(k) for k in keys)]
    assert network.key not in {n.name() for n in libvirt_conn.listAllNetworks()}
    assert realvm.ip_json("link", "show", "dev", netxml.bridge_name(network.key)) == []
    assert not PrivateNetwork.objects.filter(removed__isnull=True).exists()
    assert not Allocation.objects.filter(released__isnull=True).exists()
    print(f"\nreserve→ready of three machines: {reserve_to_ready:.1f} s")
