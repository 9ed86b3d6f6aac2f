"""Private networks of environments on their hosts: made before the first of their VMs is
defined (``ensure``), removed after the last is gone (``drop_unused``). Called by the VM
build and teardown steps (``opcodes.lifecycle``), which already hold the VM's lock and talk
to its host.

A network's spec is fixed when it is recorded (its key, range and members' hostnames, in
order), so every member's build asks the host for the same network (the drivers' create is
idempotent by key). A member's MAC on it is the driver's ``private_mac`` of its hostname, not
of its VM: the addresses and names are known before any VM of the environment exists, and a
member rebuilt as another VM keeps them.
"""

import re

from django.db import IntegrityError, transaction
from django.utils import timezone

from drivers import base
from provisioning.models import VM, PrivateNetwork


def spec(network, driver):
    """The ``NetworkSpec`` the host is asked for."""
    hosts = tuple((name, driver.private_mac(name, network.key)) for name in network.members)
    if not network.overlay:
        return base.NetworkSpec(network.key, network.cidr, hosts)
    return base.NetworkSpec(network.key, network.cidr, hosts, network.overlay, network.segment, network.home)


def ensure(vm, driver):
    """Make ``vm``'s networks on its host (again, if one was removed meanwhile); returns its
    NICs for the define call (``VMSpec.private_networks``: ``(network key, MAC)`` per network,
    in key order)."""
    if not vm.hostname:  # only an environment's machines have networks (and a hostname): no query
        return ()
    found = []
    for network in vm.networks.order_by("key"):
        driver.create_network(spec(network, driver))
        if network.removed is not None:
            PrivateNetwork.objects.filter(pk=network.pk).update(removed=None)
        found.append((network.key, driver.private_mac(vm.hostname, network.key)))
    return tuple(found)


def drop_unused(vm, driver):
    """Remove ``vm``'s networks that no other VM still has on the host (``vm`` is gone from it).

    Called once ``vm`` is recorded gone (destroyed or failed, committed). An environment's
    machines are torn down at once: another one still live in the database is asked of the
    host (its teardown may have removed it already), so whichever of them is gone last sees
    the others gone and removes the network. Two that finish together both may: the one whose
    conditional update marks the network removed deletes it. A member not yet built
    (requested) makes it again when it is (``ensure``). A network of that name the host does
    not list as vclmgr's is someone else's (the build failed on it, so ours was never made):
    it is left alone, and ours is marked removed, its range free again."""
    if not vm.hostname:
        return
    for network in vm.networks.filter(removed__isnull=True):
        others = network.vms.exclude(pk=vm.pk).filter(state__in=VM.LIVE)
        if any(driver.state(other.key) != base.VMState.ABSENT for other in others):
            continue
        if not PrivateNetwork.objects.filter(pk=network.pk, removed__isnull=True).update(removed=timezone.now()):
            continue  # another member's teardown is removing it
        try:
            driver.delete_network(network.key)
        except base.Conflict:
            if network.key not in {n.key for n in driver.list_networks()}:
                continue  # someone else's network of that name (ours was never made): left alone
            # a machine defined on it meanwhile: the last of them removes it
            PrivateNetwork.objects.filter(pk=network.pk).update(removed=None)
        except Exception:
            PrivateNetwork.objects.filter(pk=network.pk).update(removed=None)  # still there: a retry removes it
            raise


SEGMENT_ATTEMPTS = 5  # segments tried when concurrent environments take the free one first


def record(key, name, hosts, cidr, members):
    """A network of an environment on ``hosts`` (the first its home): ``members`` are the
    hostnames on it, in order. On several hosts (of one overlay) it takes a free segment of
    that overlay."""
    if len(hosts) == 1:
        return [PrivateNetwork.objects.create(key=key, name=name, host=hosts[0], cidr=cidr, members=list(members))]
    overlay = hosts[0].overlay
    for _attempt in range(SEGMENT_ATTEMPTS):
        segment = free_segment(overlay)
        if segment is None:
            return None
        spread = {"name": name, "cidr": cidr, "members": list(members), "overlay": overlay, "segment": segment}
        try:
            with transaction.atomic():  # another environment may take that segment at once: the next one
                return [
                    PrivateNetwork.objects.create(key=key, host=host, home=i == 0, **spread)
                    for i, host in enumerate(hosts)
                ]
        except IntegrityError:
            if PrivateNetwork.objects.filter(key=key, host__in=hosts).exists():
                raise  # this network is recorded already: not a segment taken meanwhile
            continue
    return None


def free_segment(overlay):
    """The lowest segment of ``overlay`` no live network is on, or None when all are taken."""
    taken = set(
        PrivateNetwork.objects.filter(overlay=overlay, removed__isnull=True, segment__isnull=False).values_list(
            "segment", flat=True
        )
    )
    return next((n for n in range(1, base.MAX_SEGMENT + 1) if n not in taken), None)


def taken_ranges(host_id):
    """The ranges of the networks on a host (made or to be made): another environment's
    networks on it must not overlap them (the host routes each to its own bridge)."""
    return list(PrivateNetwork.objects.filter(host_id=host_id, removed__isnull=True).values_list("cidr", flat=True))


def of_environment(environment_key):
    """The networks of environment ``environment_key`` (``env12``): ``env12-lan``, and
    ``env12r2-lan`` once its machines on it were built again elsewhere (``retry_key``)."""
    return PrivateNetwork.objects.filter(key__regex=rf"^{environment_key}(r[0-9]+)?-")


def retry_key(key, attempt):
    """The key of network ``key`` (``env12-lan``) recorded again for build ``attempt``:
    ``env12r2-lan`` (a network's name never makes another's key of that form: the environment's
    part ends at the first ``-``)."""
    environment, name = key.split("-", 1)
    return f"{re.sub(r'r[0-9]+$', '', environment)}r{attempt}-{name}"  # (``run7``'s own r stays)


def of_machine(environment_key, hostname, host_id=None):
    """The networks of environment ``environment_key`` (``env<id>``) that ``hostname`` is on;
    ``host_id``: those on that host, the latest of each name (a machine built again elsewhere,
    with its networks, leaves their rows of the old hosts behind until its last VM there is
    gone, and may come back to a host where they are)."""
    rows = of_environment(environment_key)
    if host_id is None:
        return [network for network in rows if hostname in network.members]
    latest = {}
    for network in rows.filter(host_id=host_id).order_by("pk"):
        if hostname in network.members:
            latest[network.name] = network
    return list(latest.values())


def address_of(network, hostname):
    """``hostname``'s fixed address on ``network`` (as ``NetworkSpec.addresses`` gives it)."""
    spec = base.NetworkSpec(network.key, network.cidr, tuple((name, "") for name in network.members))
    return next(address for name, _mac, address in spec.addresses() if name == hostname)


def group_of(environment_key, hostname):
    """``hostname`` and every machine joined to it through the environment's networks (the set
    that shares a host, or an overlay), and those networks (one row of each, the latest)."""
    latest = {}
    for network in of_environment(environment_key).order_by("pk"):
        latest[network.name] = network
    names, networks = {hostname}, {}
    grew = True
    while grew:
        grew = False
        for network in latest.values():
            if network.name not in networks and names & set(network.members):
                networks[network.name] = network
                names |= set(network.members)
                grew = True
    return names, list(networks.values())


def forget(environment_key):
    """The networks of environment ``environment_key`` none of whose machines is on a host (it
    ended before any was built): never made there, or removed with the last; their ranges are
    free again."""
    rows = of_environment(environment_key).filter(removed__isnull=True)
    rows.exclude(vms__state__in=VM.LIVE).update(removed=timezone.now())
