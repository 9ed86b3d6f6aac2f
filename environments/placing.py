"""Where an environment's machines go: all of them placed and claimed in one decision, and its
private networks recorded on the hosts they land on. Shared by whatever holds an environment
(a reservation, a batch run); the caller's transaction makes it all or nothing.

``claim`` answers ``{hostname: Allocation}`` or raises ``Refused`` with the words of the
placement (which machine does not fit where, and the earliest start for all) and its reason
counts. ``record_networks`` gives each of the template's networks a key of this instance
(``<key>-<network>``, e.g. ``env12-lan``) and a range on its host (or hosts: its machines
spread over hosts of one overlay, on a segment of it): the template's, unless another network
on one of those hosts overlaps it (the host routes each range to its own bridge), then a free
range of the same size.
"""

import ipaddress
from datetime import UTC, datetime

from django.utils import timezone

from capacity import services as capacity
from capacity.models import Allocation
from environments import rules
from environments import services as templates
from provisioning import private_networks
from provisioning import services as vms


class Refused(Exception):
    """No room for every machine: ``words`` for the user, ``reasons`` counted per host."""

    def __init__(self, words, reasons):
        super().__init__(words)
        self.words, self.reasons = words, reasons


def claim(template, machines, start, end, *, purposes, actor, owner):
    """Claim every machine (``templates.expand``'s) over ``[start, end)``; ``purposes``:
    ``{hostname: purpose}`` of each claim."""
    demands = {
        m.hostname: vms.demand_for(
            m.image,
            m.size,
            start=start,
            end=end,
            purpose=purposes[m.hostname],
            hypervisors=vms.variant_types(m.image, m.revision.pk) if m.revision is not None else None,
        )
        for m in machines
    }
    return claim_demands(
        demands, templates.together(machines), actor=actor, owner=owner, gang_id=f"environment {template.name}"
    )


def claims_to_give_back(vms, also=()):
    """The unreleased claims of the machines ``vms`` (and the claim ids ``also``: a
    reservation's own) that a retry gives back before it places them again. A VM in ``error``
    keeps its claims, as ``ending.release`` leaves them: it may still be on its host, and a
    destroy's success gives them back."""
    held, kept = set(also), set()
    for vm in vms:
        (kept if vm.state == vm.State.ERROR else held).update((vm.allocation_id, vm.target_allocation_id))
    return list(Allocation.objects.filter(pk__in=held - kept - {None}, released__isnull=True))


def claim_again(rows, networks, excluded, attempt, *, start, purposes, actor, owner, gang_id, old_claims=()):
    """Machines built again elsewhere (a build that failed, a host that died): ``rows``
    (``{hostname: row}``, each with the ``image``, ``revision_id``, size and ``end`` of its
    machine: a reservation, a VM) claimed again as one gang from ``start`` to their end, off the
    ``excluded`` hosts, together as their ``networks`` join them (one host, or hosts of one
    overlay), and those networks recorded again there under keys of build ``attempt``. One verb
    for whatever holds an environment; the caller's transaction makes it all or nothing.
    ``old_claims``: the group's claims until now, given back first.
    ``{hostname: Allocation}``, or ``Refused`` (no room for all of them: the words say so)."""
    # Released before the gang is placed, not after: the room the group needs may be its own
    # (a host of the overlay that keeps others of its machines counts their old claims). A
    # refusal rolls the release back with the rest of the caller's transaction.
    for allocation in old_claims:
        capacity.release(allocation, actor=actor, reason=f"{gang_id}: claimed again elsewhere")
    demands = {
        hostname: vms.demand_for(
            row.image,
            {"vcpus": row.vcpus, "memory_mib": row.memory_mib, "disk_gib": row.disk_gib},
            start=start,
            end=row.end,
            purpose=purposes[hostname],
            exclude_hosts=excluded,
            hypervisors=vms.variant_types(row.image, row.revision_id) if row.revision_id else None,
        )
        for hostname, row in rows.items()
    }
    together = (frozenset(rows),) if len(rows) > 1 else ()
    claims = claim_demands(demands, together, actor=actor, owner=owner, gang_id=gang_id, later=False)
    move_networks(networks, claims, attempt)
    return claims


def claim_demands(demands, together, *, actor, owner, gang_id, later=True):
    """``capacity.claim_gang`` of ``{hostname: Demand}``, refused as ``claim`` is (``later``:
    saying the earliest start that fits, which a retry of a running window has no use for)."""
    try:
        return capacity.claim_gang(demands, together, actor=actor, owner=owner, gang_id=gang_id)
    except capacity.GangRefused as exc:
        result = exc.result
        words = _words(result) if later else (result.note or "no host has room")
        raise Refused(words, dict(result.results[-1].reasons) if result.results else {}) from None
    except capacity.TryAgain as exc:
        raise Refused(str(exc), {"try_again": 1}) from None


def _words(result):
    words = result.note or "no host has room then"
    fit = result.earliest_fit
    if fit is not None and fit.start is not None:
        earliest = timezone.localtime(datetime.fromtimestamp(fit.start, UTC))
        return f"{words}; the earliest start that fits every machine is {earliest:%Y-%m-%d %H:%M %Z}"
    return f"{words}; it does not fit at any time soon"


def record_networks(key, template, machines, claims):
    """Each of the template's networks on the host of its machines (they share one), or on
    each of their hosts when placement spread them over hosts of one overlay."""
    for network in template.networks.all():
        names = [m.hostname for m in machines if network.name in m.networks]
        if names:
            _record(f"{key}-{network.name}", network.name, claims, network.cidr, names)


def move_networks(networks, claims, attempt):
    """``networks`` (``PrivateNetwork`` rows of machines claimed again elsewhere, ``claims``
    ``{hostname: Allocation}``) recorded again on their machines' new hosts, under keys of this
    ``attempt`` (``private_networks.retry_key``); the old rows stay until the last machine on
    the old host is gone."""
    for network in networks:
        key = private_networks.retry_key(network.key, attempt)
        _record(key, network.name, claims, network.cidr, network.members)


def _record(key, name, claims, wanted, names):
    """A network of ``names`` on their hosts (its first member's the home): the range
    ``wanted``, unless another network on one of those hosts overlaps it (a host routes each
    range to its own bridge), then a free range of the same size."""
    hosts = list({claims[n].host.pk: claims[n].host for n in names}.values())
    # (ranges checked when written: the template's by ``rules``, the hosts' when recorded)
    taken = [ipaddress.IPv4Network(c) for host in hosts for c in private_networks.taken_ranges(host.pk)]
    cidr = ipaddress.IPv4Network(wanted)
    if any(cidr.overlaps(t) for t in taken):
        cidr = rules.pick(len(names), taken)
        if cidr is None:
            where = " and ".join(h.name for h in hosts)
            raise Refused(f"no free range for network {name} on {where}", {"network_range": 1})
    rows = private_networks.record(key, name, hosts, str(cidr), names)
    if rows is None:
        raise Refused(f"no free segment for network {name} on overlay {hosts[0].overlay}", {"overlay_segment": 1})
    return rows
