"""Plans are objects: a dry run of hbal, hsqueeze or an evacuation, stored, then executed as jobs.

Contract:

- `compute(kind, *, actor, target="", group=None, reason="", rate_limit=None, options=None)`
  asks the Ganeti ports (`placement.ganeti`: ``balance``, ``squeeze``, ``node_evacuate``,
  ``change_group``) what to move, on the live cluster seen through `bridge.to_ganeti` with each
  host's future claims pinned in place (so no planned move lands where an accepted future
  reservation would no longer fit). Every move is then re-checked with vclmgr's own capacity
  rules, time-aware, in order (a move that does not hold is left out, with a note), and given
  the dependencies it needs: a move onto a host that cannot hold everything planned for it
  while nothing has left it yet waits for the moves that free the room. Counting both the
  target's new claim and the source's old one until a move ends, no moment overcommits a host.
  Writes one `Plan` row; refuses (``Conflict``) an empty group or evacuating the last online host.
- `execute(plan, *, actor, recompute=False)`: checks the plan against the cluster as it is now
  (a VM moved, a target drained or full: stale, refused with the reasons, or recomputed when
  asked), then submits one ``vm.migrate`` per move under ``rate-limit:N:plan-<id>``, ordered by
  job dependencies. A squeeze's emptied hosts get ``node.power_off`` after the moves that empty
  them when that opcode is registered and the host has a BMC (drained first, so nothing lands
  while it empties), else they are drained. A squeeze that brings hosts back online proposes
  only standby hosts (vclmgr powered them off: hsqueeze's ``htools:standby:`` tag) and submits
  ``node.power_on`` for each; the moves onto it depend on that job. An evacuated node, or every
  host of an evacuated group, is drained first, which re-places its future reservations
  (``node.replace_reservations``). The plan is done once its moves and those jobs ended.
  Executing twice is refused.
- `cancel(plan, *, actor)`: cancels its jobs that have not started.
- Progress: ``plan.status`` and ``plan.move`` events on topic ``plan.<id>`` (staff only): a
  move reports itself (`record_move`); the plan's other jobs, and moves that never ran, through
  the ``job.status`` listener `job_ended`, so the plan ends when its last job does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from django.db import transaction
from django.utils import timezone

import placement as core
from accounts import access
from capacity import loaders
from core import changelog, events
from core.changelog import Actor
from core.errors import Conflict
from inventory import power
from inventory import services as inventory
from inventory.models import Hypervisor, NodeGroup
from jobs import reasons, registry
from jobs import services as jobs
from jobs.models import Job
from placement.ganeti import bridge, evacuate, hbal, hsqueeze, metrics
from provisioning import services as vms
from provisioning.models import VM, Plan

K = Plan.Kind
DEFAULT_RATE_LIMIT = 4
POWER_OFF = "node.power_off"
POWER_ON = "node.power_on"
REPLACE_RESERVATIONS = "node.replace_reservations"
BATCH = 500  # jobs per submit_batch call (its own limit is 1000)
PLAN_OPCODES = ("vm.migrate", POWER_OFF, POWER_ON, REPLACE_RESERVATIONS)


def topic(plan_id):
    return f"plan.{plan_id}"


# --- the live cluster as the planners see it -------------------------------------------------


@dataclass
class Live:
    now: object
    cluster: core.Cluster  # vclmgr's model: hosts with every live claim (future ones too)
    ids: dict  # host name -> Hypervisor id
    gcluster: object  # the Ganeti model at ``now``
    vms: dict  # instance name ("vm-7") -> VM


def live(now=None):
    now = now or timezone.now()
    cluster, ids = loaders.load_cluster(now)
    built = VM.objects.filter(state__in=VM.BUILT, host__isnull=False, allocation__released__isnull=True)
    by_alloc = {str(vm.allocation_id): vm for vm in built.select_related("image", "variant", "host", "allocation")}
    gcluster = _ganeti(cluster, now, {aid: f"vm-{vm.pk}" for aid, vm in by_alloc.items()})
    by_name = {f"vm-{vm.pk}": vm for vm in by_alloc.values()}
    _mark_standby(gcluster, ids)
    for inst in gcluster.instances:
        if inst.name not in by_name:
            inst.movable = False  # a claim that is not a built VM (a parked disk, a held claim) stays
        elif by_name[inst.name].hostname:
            inst.movable = False  # an environment's machine stays with its networks and the others
        elif by_name[inst.name].warm == VM.Warm.WARM:
            inst.movable = False  # a warm VM is never moved: a drain destroys it (``warm.host_left_service``)
    return Live(now, cluster, ids, gcluster, by_name)


def _mark_standby(gcluster, ids):
    """Hosts vclmgr powered off (and may power on again) carry hsqueeze's standby tag, so a
    squeeze that lacks room proposes them, and only them, to bring back online."""
    standby = power.standby_hosts(ids.values())
    for node in gcluster.nodes:
        if ids.get(node.name) in standby and not any(t.startswith(hsqueeze.STANDBY_TAG_PREFIX) for t in node.tags):
            node.tags = [*node.tags, f"{hsqueeze.STANDBY_TAG_PREFIX}vclmgr"]


def _ganeti(cluster, now, vm_names):
    """The Ganeti view at ``now``: every claim an instance (VMs named ``vm-<id>``), each host's
    later claims one pinned instance (`bridge.to_ganeti` with ``hold_future``)."""
    names = {a.id: f"claim-{a.id}" for h in cluster.hosts for a in h.allocations}
    names.update(vm_names)
    return bridge.to_ganeti(cluster, at=loaders.ts(now), template="ext", hold_future=True, names=names)


def _scope_nodes(gcluster, group):
    if group is None:
        return list(gcluster.nodes)
    gdx = gcluster.group_index(group)
    return [n for n in gcluster.nodes if n.group == gdx]


def live_score(group=None):
    """The cluster score now (of one node group, or of all), as a plan reports its scores."""
    state = live()
    return metrics.score(_scope_nodes(state.gcluster, group))


def _utilisation(gcluster, names):
    rows = []
    for node in gcluster.nodes:
        if node.name not in names:
            continue
        mem_used = node.t_mem - node.n_mem - node.f_mem
        ratio = gcluster.groups[node.group].ipolicy.vcpu_ratio or 1.0
        cpu_total = max(1.0, (node.t_cpu - node.n_cpu) * ratio)
        rows.append(
            {
                "host": node.name,
                "memory": round(100.0 * mem_used / max(1.0, node.t_mem - node.n_mem), 1),
                "vcpus": round(100.0 * (node.u_cpu - node.n_cpu) / cpu_total, 1),
                "instances": len(node.plist),
            }
        )
    return rows


# --- compute ---------------------------------------------------------------------------------


def _group_hosts(group):
    if not NodeGroup.objects.filter(name=group).exists() and group != loaders.DEFAULT_GROUP:
        raise Conflict(f"no node group named {group!r}")
    hosts = (
        Hypervisor.objects.filter(group__name=group)
        if group != loaders.DEFAULT_GROUP
        else (Hypervisor.objects.filter(group__isnull=True))
    )
    if not hosts.exists():
        raise Conflict(f"node group {group} has no hosts: nothing to plan")
    return hosts


def _raw_moves(kind, state, target, group, options):
    """[(instance, target node)] in the planner's order, the scope's group and notes."""
    g = state.gcluster
    notes = []
    if kind == K.BALANCE:
        opts = hbal.HbalOptions(max_moves=int(options.get("max_moves", -1)), group=group)
        try:
            result = hbal.balance(g, opts)
        except (KeyError, ValueError) as exc:
            raise Conflict(exc.args[0] if exc.args else str(exc)) from None
        return [(s.instance, s.new_nodes[0]) for s in result.steps], [], notes
    if kind == K.SQUEEZE:
        if len({n.group for n in g.nodes}) > 1:
            raise Conflict("squeeze plans one node group: this cluster has several")
        try:
            result = hsqueeze.squeeze(
                g,
                target_resources=float(options.get("target_resources", 2.0)),
                minimal_resources=float(options.get("minimal_resources", 2.0)),
            )
        except (KeyError, ValueError) as exc:
            raise Conflict(exc.args[0] if exc.args else str(exc)) from None
        moves = [(s.instance, s.new_nodes[0]) for s in result.moves]
        if result.action == "online":
            return moves, [("on", n) for n in result.nodes], notes
        return moves, [("off", n) for n in result.nodes], notes
    if kind == K.EVACUATE_NODE:
        index = g.node_index(target)
        node = g.nodes[index]
        if node.offline:
            # A drained node is offline to htools, whose moves off an offline node skip the
            # capacity checks; it is never a target of its own evacuation anyway.
            nodes = list(g.nodes)
            nodes[index] = node.copy()
            nodes[index].offline = False
            g = g.replaced(nodes, g.instances)
        names = [g.instances[i].name for i in node.plist if g.instances[i].name in state.vms]
        stuck = [g.instances[i].name for i in node.plist if g.instances[i].name not in state.vms]
        notes += [f"{name} stays: not a built VM (a parked disk, a VM being changed)" for name in stuck]
        names, warm_notes = _without_warm(names, state)
        result = evacuate.node_evacuate(g, evacuate.CHANGE_ALL, names)
        notes += warm_notes
    else:
        gdx = g.group_index(target)
        names = [i.name for i in g.instances if g.nodes[i.pnode].group == gdx and i.name in state.vms]
        names, warm_notes = _without_warm(names, state)
        if not names:
            raise Conflict(f"node group {target} holds no VMs: nothing to evacuate")
        result = evacuate.change_group(g, names)
        notes += warm_notes
    notes += [f"{name} cannot move: {message}" for name, message in result.failed]
    return [(name, nodes[0]) for name, _group, nodes in result.moved], [], notes


def _without_warm(names, state):
    """The VMs to move, without a warm pool's: the drain destroys those, and the pool builds
    them again on a host in service (``warm.host_left_service``); the notes that say so."""
    warm = [name for name in names if state.vms[name].warm == VM.Warm.WARM]
    notes = [
        f"{name} is not moved: a warm pool's VM, destroyed by the drain and built again elsewhere" for name in warm
    ]
    return [name for name in names if name not in warm], notes


def _collapse(raw, state):
    """One move per VM, to where it ends up, in the order of its last move (no round trips)."""
    final = {}
    for name, node in raw:
        final.pop(name, None)
        final[name] = node
    return [(name, node) for name, node in final.items() if state.vms[name].host.name != node]


def _host_fits(host, allocations, request):
    cluster = core.Cluster((replace(host, allocations=tuple(allocations)),), (core.NodeGroup(host.group),))
    request = replace(request, policy=core.Policy.BALANCED)
    return core.PlacementEngine(cluster, core.PlacementOptions(earliest_fit=False)).place(request)


def _request(vm, now):
    demand = vms.vm_demand(
        vm, purpose=f"vm {vm.pk} (plan)", hypervisors=[vm.variant.hypervisor_type], prefer_cached=False
    )
    # From the plan's moment: the claim counts from now on, as the VM's does.
    return replace(demand.request(f"move-{vm.pk}"), start=loaders.ts(now))


def _validate(moves, state, waking=()):
    """Re-check moves in order with vclmgr's rules; returns (accepted, refusals, per-host claims).
    ``waking``: standby hosts the plan powers on first, taken for online."""
    hosts = _hosts(state, waking)
    claims = {name: list(h.allocations) for name, h in hosts.items()}
    drivers = dict(Hypervisor.objects.values_list("name", "driver"))
    accepted, refusals = [], []
    for name, target in moves:
        vm = state.vms[name]
        host = hosts.get(target)
        why = None
        if host is None:
            why = f"{target} is not a host"
        elif host.state != core.HostState.ONLINE and target not in waking:
            why = f"{target} is {host.state.value}"
        elif vm.host.driver != drivers.get(target):
            why = f"{target} runs another driver than {vm.host.name}"
        else:
            request = _request(vm, state.now)
            result = _host_fits(host, claims[target], request)
            if not result.ok:
                why = result.explained()
        if why:
            refusals.append(f"{name} → {target} refused: {why}")
            continue
        accepted.append({"name": name, "request": request, "alloc": str(vm.allocation_id), "to": target})
        claims[target].append(_as_allocation(request, f"plan:{name}"))
        source = vm.host.name
        claims[source] = [a for a in claims[source] if a.id != str(vm.allocation_id)]
    return accepted, refusals, claims


def _hosts(state, waking=()):
    return {h.name: replace(h, state=core.HostState.ONLINE) if h.name in waking else h for h in state.cluster.hosts}


def _as_allocation(request, alloc_id):
    return core.Allocation(
        id=alloc_id,
        resources=request.resources,
        start=request.start,
        end=request.end,
        anti_affinity=request.anti_affinity,
    )


def _dependencies(accepted, state, waking=()):
    """Per move, the indexes of the moves it waits for (see the module's docstring)."""
    hosts = _hosts(state, waking)
    inbound, outbound = {}, {}
    for i, move in enumerate(accepted):
        inbound.setdefault(move["to"], []).append(i)
        outbound.setdefault(state.vms[move["name"]].host.name, []).append(i)
    deps = [[] for _ in accepted]
    for target, ins in inbound.items():
        host, claims = hosts[target], list(hosts[target].allocations)
        if _all_fit(host, claims, [accepted[i] for i in ins]):
            continue  # room for all of it at once, whatever order the moves run in
        released, previous = set(), None
        for i in ins:
            if previous is not None:
                deps[i].append(previous)  # one move onto a tight host at a time, in plan order
            waiting = [o for o in outbound.get(target, []) if o < i and o not in released]
            while not _fits_now(host, claims, accepted, ins, i, released) and waiting:
                freed = waiting.pop(0)
                released.add(freed)
                deps[i].append(freed)
            previous = i
    return [sorted(set(d)) for d in deps]


def _all_fit(host, claims, moves):
    current = list(claims)
    for move in moves:
        if not _host_fits(host, current, move["request"]).ok:
            return False
        current.append(_as_allocation(move["request"], f"plan:{move['name']}"))
    return True


def _fits_now(host, claims, accepted, ins, i, released):
    gone = {accepted[o]["alloc"] for o in released}
    current = [a for a in claims if a.id not in gone]
    current += [_as_allocation(accepted[k]["request"], f"plan:{accepted[k]['name']}") for k in ins if k < i]
    return _host_fits(host, current, accepted[i]["request"]).ok


def _after(state, claims, waking=()):
    """The Ganeti view once the accepted moves are done, built as the live view is (so the
    plan's final score is what the live cluster will score)."""
    hosts = tuple(replace(h, allocations=tuple(claims[h.name])) for h in _hosts(state, waking).values())
    names = {f"plan:{name}": name for name in state.vms}
    names.update({str(vm.allocation_id): name for name, vm in state.vms.items()})
    return _ganeti(replace(state.cluster, hosts=hosts), state.now, names)


def _future_claims(state, host_names, effect):
    now = loaders.ts(state.now)
    found = []
    for host in state.cluster.hosts:
        if host.name in host_names:
            for a in host.allocations:
                if a.start > now:
                    found.append(
                        {"allocation": int(a.id), "host": host.name, "start": a.start, "end": a.end, "effect": effect}
                    )
    return found


def _basis(state, host_names):
    return {
        h.name: {"state": h.state.value, "claims": sorted(int(a.id) for a in h.allocations)}
        for h in state.cluster.hosts
        if h.name in host_names
    }


def _check_target(kind, target, group):
    if kind == K.EVACUATE_NODE:
        host = Hypervisor.objects.filter(name=target).select_related("group").first()
        if host is None:
            raise Conflict(f"no hypervisor named {target!r}")
        others = Hypervisor.objects.filter(state=Hypervisor.State.ONLINE, group_id=host.group_id).exclude(pk=host.pk)
        if not others.exists():
            where = f"group {host.group.name}" if host.group else "the cluster"
            raise Conflict(f"cannot evacuate {host.name}: it is the last online host of {where}")
        return host.group.name if host.group else loaders.DEFAULT_GROUP
    if kind == K.EVACUATE_GROUP:
        _group_hosts(target)
        if (
            not Hypervisor.objects.filter(state=Hypervisor.State.ONLINE)
            .exclude(**({"group__name": target} if target != loaders.DEFAULT_GROUP else {"group__isnull": True}))
            .exists()
        ):
            raise Conflict(f"cannot evacuate group {target}: no online host outside it")
        return None
    if group is not None:
        _group_hosts(group)
    return group


def _fill(plan, state=None):
    """(Re)compute the plan's content on the cluster as it is now."""
    state = state or live()
    kind, target, options = plan.kind, plan.target, plan.options
    group = options.get("group")
    if not state.cluster.hosts:
        raise Conflict("the inventory has no hypervisors: nothing to plan")
    scope_group = _check_target(kind, target, group)
    groups = {state.gcluster.groups[n.group].name for n in state.gcluster.nodes}
    if kind == K.BALANCE and group is None:
        if len(groups) > 1:
            raise Conflict(f"the cluster has several node groups ({', '.join(sorted(groups))}): choose one")
        scope_group = next(iter(groups), None)
    raw, switches, notes = _raw_moves(kind, state, target, group, options)
    waking = {name for how, name in switches if how == "on"}
    accepted, refusals, claims = _validate(_collapse(raw, state), state, waking)
    deps = _dependencies(accepted, state, waking)
    after = _after(state, claims, waking)
    score_group = scope_group if kind in (K.BALANCE, K.EVACUATE_NODE) else None
    plan.options = {**options, "score_group": score_group}
    plan.score_before = metrics.score(_scope_nodes(state.gcluster, score_group))
    plan.score_after = metrics.score(_scope_nodes(after, score_group))
    plan.moves = [_move_row(i, move, deps[i], state) for i, move in enumerate(accepted)]
    plan.power_off = [name for how, name in switches if how == "off"]
    plan.power_on = [name for how, name in switches if how == "on"]
    involved = {m["from"] for m in plan.moves} | {m["to"] for m in plan.moves} | set(plan.power_off)
    involved |= set(plan.power_on)
    moved_off = set()
    if kind == K.EVACUATE_NODE:
        moved_off = {target}
    elif kind == K.EVACUATE_GROUP:
        moved_off = set(_group_hosts(target).values_list("name", flat=True))
    involved |= moved_off
    plan.basis = _basis(state, involved)
    plan.claims = _future_claims(state, moved_off, "re-placed elsewhere (node.replace_reservations)")
    plan.claims += _future_claims(state, involved - moved_off, "kept: counted as taken over its window")
    plan.utilisation = {"before": _utilisation(state.gcluster, involved), "after": _utilisation(after, involved)}
    plan.notes = notes + refusals
    return plan


def _move_row(i, move, deps, state):
    vm = state.vms[move["name"]]
    return {
        "index": i,
        "vm": vm.pk,
        "name": vm.name or vm.key,
        "from": vm.host.name,
        "from_id": vm.host_id,
        "to": move["to"],
        "to_id": state.ids[move["to"]],
        "allocation": vm.allocation_id,
        "vcpus": vm.vcpus,
        "memory_mib": vm.memory_mib,
        "disk_gib": vm.disk_gib,
        "depends": deps,
        "job": None,
        "status": "planned",
    }


def rate_limit_of(reason, default=None):
    """N of a ``rate-limit:N:…`` reason (``BadReason`` when malformed), else ``default``."""
    found = reasons.bucket(reason) if reason else None
    return found[1] if found else default


def compute(kind, *, actor, target="", group=None, reason="", rate_limit=None, options=None):
    """Compute and store a plan (a dry run: nothing but the Plan row is written)."""
    if kind not in K.values:
        raise Conflict(f"unknown plan kind {kind!r}: one of {', '.join(K.values)}")
    if kind in (K.EVACUATE_NODE, K.EVACUATE_GROUP) and not target:
        raise Conflict(f"a {kind} plan needs a target ({'node' if kind == K.EVACUATE_NODE else 'group'} name)")
    try:
        reason = reasons.check(reason) if reason else ""
        said = rate_limit_of(reason)
    except reasons.BadReason as exc:
        raise Conflict(f"reason: {exc}") from None
    # 0 is a number given, not "none given": refused below rather than read as the default.
    limit = rate_limit if rate_limit is not None else said or DEFAULT_RATE_LIMIT
    if not 1 <= int(limit) <= 10000:
        raise Conflict("rate_limit must be between 1 and 10000")
    if said is not None and int(limit) != said:
        raise Conflict(f"the reason says rate-limit {said}, rate_limit says {limit}: give one of them")
    actor = Actor.of(actor)
    plan = Plan(
        kind=kind,
        target=target or "",
        reason=reason,
        rate_limit=int(limit),
        options={**(options or {}), "group": group},
        created_by=actor.label[:150],
    )
    _fill(plan)
    with transaction.atomic():
        plan.save()
        changelog.record(plan, "create", actor, reason=reason or f"{kind} plan computed")
    return plan


# --- check and execute -----------------------------------------------------------------------


def _standby_names(state):
    standby = power.standby_hosts(state.ids.values())
    return {name for name, pk in state.ids.items() if pk in standby}


def problems(plan, state=None):
    """Why the plan no longer holds on the cluster as it is now (empty: it holds)."""
    state = state or live()
    found = []
    moves = []
    for move in plan.moves:
        vm = state.vms.get(f"vm-{move['vm']}")
        if vm is None:
            found.append(f"VM {move['vm']} is no longer a built VM with a live claim")
        elif vm.host_id != move["from_id"] or vm.allocation_id != move["allocation"]:
            found.append(f"{move['name']} is no longer on {move['from']} with claim {move['allocation']}")
        else:
            moves.append((f"vm-{move['vm']}", move["to"]))
    _, refusals, _ = _validate(moves, state, set(plan.power_on))
    found += refusals
    hosts = {h.name: h for h in state.cluster.hosts}
    for name in plan.power_off:
        host = hosts.get(name)
        now = loaders.ts(state.now)
        if host is not None and any(a.start > now for a in host.allocations):
            found.append(f"{name} now holds future claims: it cannot be powered off")
    for name in plan.power_on:
        host = hosts.get(name)
        if host is not None and host.state != core.HostState.ONLINE and host.name not in _standby_names(state):
            found.append(f"{name} is {host.state.value} and no longer on standby: the plan cannot power it on")
    if plan.kind == K.EVACUATE_NODE and plan.target not in hosts:
        found.append(f"{plan.target} is gone")
    return found


def execute(plan, *, actor, recompute=False):
    """Submit the plan's jobs (see the module's docstring); returns the plan."""
    actor = Actor.of(actor)
    with transaction.atomic():
        plan = Plan.objects.select_for_update().get(pk=plan.pk)
        if plan.state != Plan.State.COMPUTED:
            raise Conflict(f"plan {plan.pk} is {plan.state}: a plan is executed once")
        state = live()
        found = problems(plan, state)
        if found and recompute:
            _fill(plan, state)
            plan.notes = [*plan.notes, f"recomputed at execution: {'; '.join(found)[:900]}"]
            found = problems(plan, state)
        if found:
            raise Conflict(f"plan {plan.pk} is stale: {'; '.join(found[:5])}" + (" …" if len(found) > 5 else ""))
        waking = _prepare_hosts(plan, actor)
        _submit(plan, actor, waking)
        plan.state = Plan.State.EXECUTING if any(m["job"] for m in plan.moves) or plan.jobs else Plan.State.DONE
        plan.executed = timezone.now()
        plan.finished = plan.executed if plan.state == Plan.State.DONE else None
        plan.save()
        changelog.record(plan, "state", actor, {"state": ["computed", plan.state]}, reason=plan.reason or "executed")
        _emit_status(plan)
    return plan


def _prepare_hosts(plan, actor):
    """Drain what must take nothing new while it empties; power on (or bring back) squeeze's
    hosts. Returns {host name: power-on job id} for the moves onto them to wait for."""
    if plan.kind == K.EVACUATE_NODE:
        host = Hypervisor.objects.get(name=plan.target)
        _drain(plan, host, f"evacuating: plan {plan.pk}", actor)
    elif plan.kind == K.EVACUATE_GROUP:
        for host in _group_hosts(plan.target).order_by("name"):
            _drain(plan, host, f"evacuating group {plan.target}: plan {plan.pk}", actor)
    waking = {}
    for name in plan.power_on:
        host = Hypervisor.objects.get(name=name)
        if registry.registered(POWER_ON) and host.power_standby and host.bmc() is not None:
            job = jobs.submit(
                POWER_ON,
                {"node": name, "reason": f"powered on by plan {plan.pk}"},
                actor=actor,
                source=f"plan {plan.pk}",
            )
            plan.jobs.append({"opcode": POWER_ON, "job": job.pk, "host": name, "status": job.status})
            waking[name] = job.pk
        elif host.state != Hypervisor.State.ONLINE:
            inventory.set_state(host, Hypervisor.State.ONLINE, f"brought back by plan {plan.pk}", actor=actor)
    for name in plan.power_off:
        host = Hypervisor.objects.get(name=name)
        if _powers_off(host):
            # Nothing new lands on it while it empties, or the power-off would find it held.
            reason = f"emptying to power off: plan {plan.pk}"
        else:
            reason = (
                f"powered off by plan {plan.pk}"
                if not registry.registered(POWER_OFF)
                else (f"emptied by plan {plan.pk}: no BMC to power it off")
            )
        if host.state == Hypervisor.State.ONLINE:
            inventory.set_state(host, Hypervisor.State.DRAINED, reason, actor=actor)
    return waking


def _powers_off(host):
    return registry.registered(POWER_OFF) and host.bmc() is not None


def _drain(plan, host, reason, actor):
    """Drain a host being evacuated: that re-places its future reservations
    (``node.replace_reservations``, submitted by the drain), whose jobs the plan lists."""
    before = Job.objects.filter(opcode=REPLACE_RESERVATIONS).order_by("-pk").values_list("pk", flat=True).first()
    if host.state == Hypervisor.State.ONLINE:
        inventory.set_state(host, Hypervisor.State.DRAINED, reason[:500], actor=actor)
    submitted = Job.objects.filter(opcode=REPLACE_RESERVATIONS, pk__gt=before or 0, params__hypervisor=host.pk)
    plan.jobs += [
        {"opcode": REPLACE_RESERVATIONS, "job": pk, "status": status}
        for pk, status in submitted.values_list("pk", "status")
    ]
    held = any(c["host"] == host.name for c in plan.claims)
    if not submitted.exists() and held and registry.registered(REPLACE_RESERVATIONS):
        job = jobs.submit(REPLACE_RESERVATIONS, {"hypervisor": host.pk}, actor=actor, reason=f"plan {plan.pk}")
        plan.jobs.append({"opcode": REPLACE_RESERVATIONS, "job": job.pk, "status": job.status})


def _submit(plan, actor, waking):
    trail = [reasons.entry("plan", plan.reason)] if plan.reason else []
    created = {}
    for start in range(0, len(plan.moves), BATCH):
        chunk = plan.moves[start : start + BATCH]
        specs = [
            {
                "opcode": "vm.migrate",
                "params": {"vm": m["vm"], "target": m["to_id"], "plan": plan.pk},
                "reason": plan.bucket,
                "depends": [created[d] for d in m["depends"]] + ([waking[m["to"]]] if m["to"] in waking else []),
            }
            for m in chunk
        ]
        for move, job in zip(
            chunk, jobs.submit_batch(specs, actor=actor, source=f"plan {plan.pk}", trail=trail), strict=True
        ):
            created[move["index"]] = job.pk
            move["job"], move["status"] = job.pk, job.status
    for name in plan.power_off:
        if not _powers_off(Hypervisor.objects.get(name=name)):
            continue
        emptying = [m["job"] for m in plan.moves if m["from"] == name]
        # Past MAX_DEPENDS moves the job could start before the host is empty; it then fails
        # ("cannot power off …: N VMs"), and the host stays drained.
        job = jobs.submit(
            POWER_OFF,
            {"node": name, "reason": f"powered off by plan {plan.pk}"},
            actor=actor,
            reason=plan.bucket,
            source=f"plan {plan.pk}",
            depends=emptying[-jobs.MAX_DEPENDS :],
            trail=trail,
        )
        plan.jobs.append({"opcode": POWER_OFF, "job": job.pk, "host": name, "status": job.status})


# --- progress and cancel -----------------------------------------------------------------------


def record_move(plan_id, job_id, status, message="", *, actor=None):
    """A move's job ended (``vm.migrate`` calls this): keep the row in step, tell the page."""
    with transaction.atomic():
        plan = Plan.objects.select_for_update().filter(pk=plan_id).first()
        if plan is None:
            return None
        for move in plan.moves:
            if move["job"] == job_id:
                move["status"], move["error"] = status, message[:500]
                events.emit("plan.move", {"plan": plan.pk, **move}, [topic(plan.pk), "admin"])
        _settle(plan)
        plan.save(update_fields=["moves", "state", "finished"])
    return status


def refresh(plan):
    """Bring the moves' statuses (and the plan's state) up to date from their jobs; a move that
    ended since is told to the plan's page (a move canceled before it ran never told it)."""
    if plan.state != Plan.State.EXECUTING:
        return plan
    with transaction.atomic():
        plan = Plan.objects.select_for_update().get(pk=plan.pk)
        if plan.state != Plan.State.EXECUTING:
            return plan
        ids = [m["job"] for m in plan.moves if m["job"]] + [j["job"] for j in plan.jobs]
        statuses = dict(Job.objects.filter(pk__in=ids).values_list("pk", "status"))
        for rows, is_move in ((plan.moves, True), (plan.jobs, False)):
            for row in rows:
                # A final status stays: ``record_move`` writes the move's outcome in the job's
                # last step, a moment before the job's own row ends.
                if row["job"] not in statuses or row["status"] in Job.FINAL:
                    continue
                row["status"] = statuses[row["job"]]
                if is_move and row["status"] in Job.FINAL:
                    events.emit("plan.move", {"plan": plan.pk, **row}, [topic(plan.pk), "admin"])
        _settle(plan)
        plan.save(update_fields=["moves", "jobs", "state", "finished"])
    return plan


def job_ended(kind, data, topics, ids):
    """Listener of ``job.status``: when one of a plan's jobs ends that ``record_move`` does not
    report (a power or re-placing job, a move that failed or was canceled before it ran), the
    plan is brought up to date once that commits, so it ends (and says so on ``plan.<id>``)
    without anyone reading it. A successful move reported itself in its last step."""
    if data.get("status") not in Job.FINAL or data.get("opcode") not in PLAN_OPCODES:
        return
    if data["opcode"] == "vm.migrate" and data["status"] == Job.Status.SUCCESS:
        return
    job_id = data["id"]
    transaction.on_commit(lambda: _refresh_plans_of(job_id), robust=True)


def _refresh_plans_of(job_id):
    for plan in Plan.objects.filter(state=Plan.State.EXECUTING).only("pk", "state", "moves", "jobs"):
        if any(row["job"] == job_id for row in [*plan.moves, *plan.jobs]):
            refresh(plan)


def _settle(plan):
    if plan.state != Plan.State.EXECUTING:
        return
    # Its other jobs too: a squeeze is done once its hosts are powered off (or on).
    statuses = [m["status"] for m in plan.moves] + [j.get("status", "") for j in plan.jobs]
    if all(s in Job.FINAL for s in statuses):
        plan.state = Plan.State.DONE if all(s == "success" for s in statuses) else Plan.State.FAILED
        plan.finished = timezone.now()
        _emit_status(plan)


def cancel(plan, *, actor, reason=""):
    """Cancel a plan: a computed one is simply closed; an executing one cancels its jobs that
    have not started (running moves finish). Returns the plan."""
    actor = Actor.of(actor)
    with transaction.atomic():
        plan = Plan.objects.select_for_update().get(pk=plan.pk)
        if plan.state in Plan.FINAL:
            raise Conflict(f"plan {plan.pk} is {plan.state} already")
        before = plan.state
        ids = [m["job"] for m in plan.moves if m["job"]] + [j["job"] for j in plan.jobs]
        for job in Job.objects.filter(pk__in=ids, status__in=Job.PENDING):
            jobs.cancel(job, actor=actor, reason=reason or f"plan {plan.pk} canceled")
        statuses = dict(Job.objects.filter(pk__in=ids).values_list("pk", "status"))
        for move in plan.moves:
            move["status"] = statuses.get(move["job"], "canceled")
        plan.state, plan.finished = Plan.State.CANCELED, timezone.now()
        plan.save()
        changelog.record(plan, "state", actor, {"state": [before, "canceled"]}, reason=reason or "canceled")
        _emit_status(plan)
    return plan


def _emit_status(plan):
    data = {
        "plan": plan.pk,
        "state": plan.state,
        "moves": len(plan.moves),
        "done": sum(1 for m in plan.moves if m["status"] == "success"),
    }
    events.emit("plan.status", data, [topic(plan.pk), "admin"])


def visible_to(user):
    return Plan.objects.all() if access.can(user, "see_cluster") else Plan.objects.none()
