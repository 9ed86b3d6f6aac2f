"""Where the Ganeti-style commands get their cluster: the live inventory (at a moment, with
its reservations), a Ganeti htools text-backend file, or ``--simulate`` specs (those two in
`capacity.htools`, which also runs without Django)."""

import re
from collections import Counter

from django.core.management.base import CommandError
from django.utils import timezone

from capacity import htools, loaders
from capacity.durations import parse_moment
from capacity.models import Allocation
from placement.ganeti import bridge


def ganeti_cluster(options, template="plain", hold_future=False):
    """``hold_future``: for plans that must hold from then on (hbal, hsqueeze), pin each
    host's later reservations in place (see `bridge.to_ganeti`)."""
    try:
        cluster = htools.file_cluster(options)
    except htools.CommandFailed as error:
        raise CommandError(str(error)) from None
    if cluster is not None:
        return cluster
    try:
        moment = parse_moment(options.get("at") or "now")
    except ValueError as error:
        raise CommandError(str(error)) from None
    cluster, _ = loaders.load_cluster(min(moment, timezone.now()))
    if not cluster.hosts:
        raise CommandError("the inventory has no hypervisors (use --simulate or --ganeti-file)")
    return bridge.to_ganeti(
        cluster, at=loaders.ts(moment), template=template, hold_future=hold_future, names=_instance_names(cluster)
    )


def _instance_names(cluster):
    """Instances named after what holds them ('vm 7' → ``vm-7``), so move plans and the
    gnt-instance commands read as VMs; the allocation id is added where names repeat."""
    ids = [a.id for h in cluster.hosts for a in h.allocations]
    purposes = dict(Allocation.objects.filter(pk__in=ids).values_list("pk", "purpose"))
    names = {a: re.sub(r"[^\w.:-]+", "-", purposes.get(int(a), "") or "").strip("-") or f"allocation-{a}" for a in ids}
    repeated = Counter(names.values())
    return {a: name if repeated[name] == 1 else f"{name}-{a}" for a, name in names.items()}
