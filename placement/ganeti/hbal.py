"""Cluster balancing on the Ganeti model — hbal's moves, scored incrementally.

Contract: `balance(cluster, HbalOptions(...)) -> HbalResult` lowers the htools cluster
score with the same move kinds, feasibility rules and stopping rule as Ganeti's hbal 3.0
(only DRBD and shared-storage instances move; offline/drained nodes never receive;
``--min-gain``/``--min-gain-limit``/``--min-score``/``-l``). Unlike hbal, a candidate move
is not scored by rescanning the cluster: `greedy.Scoreboard` keeps the score's sums and updates
them for the two or three nodes a move touches, and each node's outcome of a move is
memoised until that node changes. The result carries the move plan, the gnt-instance
commands and the final cluster (write it with `text_backend.serialize`).

Strategies: "steepest" is hbal's own steepest descent — the best move every round — and
takes exactly hbal's path (same moves, same scores, checked against Ganeti); it re-scores
the whole neighbourhood after each move in numpy (`steepest`). "lazy" re-ranks candidates
lazily (`greedy.greedy_balance`): a different (sometimes better, sometimes worse) local optimum.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import greedy as core
from . import types as T
from .cluster import GCluster
from .fast_moves import node_effects, node_values_after
from .instance import Instance
from .metrics import KINDS, NAMES, ONLINE, WEIGHTS, node_values, score
from .moves import (
    FAILOVER,
    FAILOVER_AND_REPLACE,
    FAILOVER_ANY,
    REPLACE_AND_FAILOVER,
    REPLACE_PRIMARY,
    REPLACE_SECONDARY,
    Move,
    apply_move,
    possible_moves,
)
from .steepest import steepest_descent


@dataclass(frozen=True, slots=True)
class HbalOptions:
    max_moves: int = -1
    min_score: float = 1e-9
    min_gain: float = 0.01
    min_gain_limit: float = 0.1
    disk_moves: bool = True
    instance_moves: bool = True
    evac_mode: bool = False
    restricted_migration: bool = False
    ignore_soft_errors: bool = False
    group: str | None = None
    offline: tuple[str, ...] = ()
    select_instances: tuple[str, ...] = ()
    exclude_instances: tuple[str, ...] = ()
    #: "lazy" (lazy re-ranking), "steepest" (best move every round: hbal's exact path) or
    #: "both" (run each, keep the lower final score); "auto": both while the move
    #: neighbourhood is small (≤ AUTO_BOTH_LIMIT candidate moves), steepest up to
    #: STEEPEST_LIMIT (its cost per move grows with the neighbourhood), else lazy;
    #: "ganeti": steepest up to STEEPEST_LIMIT, else lazy (the hbal command's default).
    strategy: str = "auto"


#: Largest move neighbourhood for which "auto" also runs the steepest strategy.
AUTO_BOTH_LIMIT = 3000
#: Largest move neighbourhood for which "auto" runs the steepest strategy. Steepest re-scores
#: the whole neighbourhood after every move (hbal's own cost, about 7 µs a candidate), and a
#: big cluster needs many moves: 100 hosts / 1,000 instances (100,000 candidates) took 0.7 s a
#: move against lazy's 0.2 s (wall, loaded machine), and 200 / 2,000 did not finish in 20 minutes. Above this, lazy.
STEEPEST_LIMIT = 50_000


@dataclass(slots=True)
class MoveStep:
    instance: str
    move: str
    old_nodes: tuple[str, ...]
    new_nodes: tuple[str, ...]
    score: float
    commands: list[str]

    def line(self, number: int) -> str:
        old = ":".join(self.old_nodes)
        new = ":".join(self.new_nodes)
        return f"{number:4d}. {self.instance} {old} => {new} {self.score:.8f} a={self.move}"

    def to_dict(self) -> dict:
        return {
            "instance": self.instance,
            "move": self.move,
            "from": list(self.old_nodes),
            "to": list(self.new_nodes),
            "score": self.score,
            "commands": self.commands,
        }


@dataclass(slots=True)
class HbalResult:
    initial_score: float
    final_score: float
    steps: list[MoveStep]
    cluster: GCluster
    evaluations: int = 0
    full_passes: int = 0
    notes: list[str] = field(default_factory=list)

    def commands(self) -> list[str]:
        return [f"gnt-instance {c}" for step in self.steps for c in step.commands]

    def to_dict(self) -> dict:
        return {
            "initial_score": self.initial_score,
            "final_score": self.final_score,
            "moves": [s.to_dict() for s in self.steps],
            "notes": self.notes,
        }


class _GanetiProblem(core.BalanceProblem):
    def __init__(self, cluster: GCluster, scope: list[int], opts: HbalOptions) -> None:
        self.nodes = list(cluster.nodes)
        self.instances = list(cluster.instances)
        self.opts = opts
        self.scope = set(scope)
        self.targets = [i for i in scope if not self.nodes[i].offline]
        self.target_set = set(self.targets)
        offline = {i for i in scope if self.nodes[i].offline}
        chosen = []
        for inst in self.instances:
            if inst.pnode not in self.scope:
                continue
            if not (inst.movable and inst.auto_balance):
                continue
            if opts.select_instances and inst.name not in opts.select_instances:
                continue
            if inst.name in opts.exclude_instances:
                continue
            if opts.evac_mode and not any(n in offline for n in inst.all_nodes()):
                continue
            chosen.append(inst.idx)
        self.movable = chosen
        #: Per node: (instance, op sequence) -> values after the ops, or _REFUSED.
        self.memo: list[dict] = [{} for _ in self.nodes]

    def items(self):
        return self.movable

    def moves(self, item):
        inst = self.instances[item]
        targets = [t for t in self.targets if t != inst.pnode and t != inst.snode]
        return possible_moves(
            inst,
            targets,
            secondary_ok=inst.snode in self.target_set,
            instance_moves=self.opts.instance_moves,
            disk_moves=self.opts.disk_moves,
            restricted_migration=self.opts.restricted_migration,
            primary_offline=self.nodes[inst.pnode].offline,
        )

    def involved(self, item, move):
        inst = self.instances[item]
        nodes = [inst.pnode]
        if inst.snode >= 0:
            nodes.append(inst.snode)
        if move.target >= 0:
            nodes.append(move.target)
        return nodes

    def evaluate(self, item, move):
        # Each node's outcome is memoised per (instance, op sequence) until that node
        # changes: most candidates re-evaluated after a move share all but one node's.
        inst = self.instances[item]
        changes = []
        for idx, ops in node_effects(self.nodes, inst, move, self.opts.ignore_soft_errors):
            memo = self.memo[idx]
            key = (item, ops)
            values = memo.get(key)
            if values is None:
                try:
                    values = node_values_after(self.nodes[idx], inst, ops)
                except T.AllocFailure:
                    values = _REFUSED
                memo[key] = values
            if values is _REFUSED:
                return None
            changes.append((idx, values))
        return core.Evaluation(changes)

    def apply(self, item, move, evaluation):
        changed, new_inst = apply_move(self.nodes, self.instances[item], move, force=self.opts.ignore_soft_errors)
        for idx, node in changed.items():
            self.nodes[idx] = node
            self.memo[idx] = {}
        # The instance's own entries name its old nodes: drop them everywhere.
        for memo in self.memo:
            for key in [k for k in memo if k[0] == item]:
                del memo[key]
        self.instances[item] = new_inst
        evaluation.payload = (changed, new_inst)


_REFUSED = object()  # memo marker: the ops fail on that node


def _scope(cluster: GCluster, group: str | None) -> list[int]:
    groups_used = sorted({n.group for n in cluster.nodes})
    if group is not None:
        gdx = cluster.group_index(group)
    elif len(groups_used) == 1:
        gdx = groups_used[0]
    else:
        names = ", ".join(cluster.groups[g].name for g in groups_used)
        raise ValueError(f"Found multiple node groups: {names}; choose one with group=")
    return [n.idx for n in cluster.nodes if n.group == gdx]


def balance(cluster: GCluster, options: HbalOptions | None = None) -> HbalResult:
    opts = options or HbalOptions()
    if opts.offline:
        cluster = cluster.set_offline(opts.offline)
    scope = _scope(cluster, opts.group)
    if opts.strategy not in ("auto", "ganeti", "lazy", "steepest", "both"):
        raise ValueError(f"unknown strategy {opts.strategy!r}: use auto, ganeti, lazy, steepest or both")
    strategies = {"lazy": [False], "steepest": [True], "both": [False, True]}.get(opts.strategy)
    if strategies is None:
        probe = _GanetiProblem(cluster, scope, opts)
        size = sum(len(probe.moves(i)) for i in probe.items())
        if opts.strategy == "ganeti":  # hbal's own path while it fits in memory
            strategies = [size <= STEEPEST_LIMIT]
        elif size <= AUTO_BOTH_LIMIT:
            strategies = [False, True]
        else:
            strategies = [True] if size <= STEEPEST_LIMIT else [False]
    results = [_run(cluster, scope, opts, steepest) for steepest in strategies]
    return min(results, key=lambda r: (round(r.final_score, 12), len(r.steps)))


def _run(cluster: GCluster, scope: list[int], opts: HbalOptions, steepest: bool, search=None) -> HbalResult:
    """``search(problem, board, rule, on_step) -> GreedyStats`` replaces the strategy's own
    (tests give a slow reference to hold `steepest.steepest_descent` to)."""
    in_scope = set(scope)
    problem = _GanetiProblem(cluster, scope, opts)
    counts = [
        tuple((i in in_scope) and (ONLINE[c] != n.offline) for c in range(len(KINDS)))
        for i, n in enumerate(cluster.nodes)
    ]
    board = core.Scoreboard(KINDS, WEIGHTS, [node_values(n) for n in cluster.nodes], counts, memoize=True)
    initial = score(cluster.nodes[i] for i in scope)
    rule = core.GainRule(opts.min_gain, opts.min_gain_limit, opts.min_score, opts.max_moves)
    steps: list[MoveStep] = []
    before = list(cluster.instances)

    def record(step: core.Applied) -> None:
        _, new_inst = step.payload
        steps.append(_describe(problem, before[step.item], new_inst, step.move, step.score))
        before[step.item] = new_inst

    if search is None:
        search = steepest_descent if steepest else core.greedy_balance
    stats = search(problem, board, rule, record)
    final = cluster.replaced(problem.nodes, problem.instances)
    return HbalResult(
        initial,
        score(final.nodes[i] for i in scope),
        steps,
        final,
        stats.evaluations,
        stats.full_passes,
        ["steepest" if steepest else "lazy"],
    )


def _describe(problem, old: Instance, new: Instance, move: Move, value: float) -> MoveStep:
    names = [n.name for n in problem.nodes]

    def nodes_of(inst: Instance) -> tuple[str, ...]:
        return (names[inst.pnode],) if inst.snode < 0 else (names[inst.pnode], names[inst.snode])

    target = names[move.target] if move.target >= 0 else ""
    text = move.describe(target)
    verb = "migrate" if old.running else "failover"
    mig = f"{verb} -f {old.name}"
    rep = f"replace-disks -n {{}} {old.name}"
    commands = {
        FAILOVER: [mig],
        FAILOVER_ANY: [f"{verb} -f -n {target} {old.name}"],
        REPLACE_SECONDARY: [rep.format(target)],
        REPLACE_AND_FAILOVER: [rep.format(target), mig],
        REPLACE_PRIMARY: [mig, rep.format(target), mig],
        FAILOVER_AND_REPLACE: [mig, rep.format(target)],
    }[move.kind]
    return MoveStep(old.name, text, nodes_of(old), nodes_of(new), value, commands)


# ---------------------------------------------------------------------- Ganeti's text


def ganeti_float(value: float) -> str:
    """``%.8f`` as Ganeti prints it: Haskell rounds the shortest decimal digits of the double
    half to even, C and Python round its exact binary value; they differ only when those
    digits end in a 5 just past the eighth decimal."""
    text = repr(value)
    mantissa, _, exponent = text.partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = whole.lstrip("-") + frac
    if not digits.isdigit() or int(exponent or 0) - len(frac) != -9 or digits[-1] != "5":
        return f"{value:.8f}"
    units = int(digits) // 10  # in 1e-8, the half dropped
    units += units % 2  # exactly half: to the even neighbour
    return f"{'-' if text.startswith('-') else ''}{units // 10**8}.{units % 10**8:08d}"


def haskell_g6(value: float) -> str:
    """Haskell's ``printf "%.6g"``: six decimals, in exponent form (no zero padding) below
    0.1 or from 10^7 on."""
    if value == 0 or 0.1 <= abs(value) < 1e7:
        return f"{value:.6f}"
    mantissa, _, exponent = f"{value:.6e}".partition("e")
    return f"{mantissa}e{int(exponent)}"


def optimal_score(cluster: GCluster, group: str | None) -> float:
    """Ganeti's `optimalCVScore` of the group: the reserved-memory term's floor, the lowest
    score its DRBD peers allow (hbal stops there, and does not start when already there)."""
    nodes = [cluster.nodes[i] for i in _scope(cluster, group)]
    if len(nodes) < 2:
        return 0.0
    total = float(sum(n.t_mem for n in nodes))
    one_less = total - max(n.t_mem for n in nodes)
    if not one_less > 0:
        return 0.0
    drbd = float(sum(sum(n.peers.values()) for n in nodes))
    return WEIGHTS[NAMES.index("reserved_mem_rtotal")] * (drbd / one_less - drbd / total)


def _common_suffix(names: list[str]) -> str:
    """Ganeti's `longestDomain`: the longest suffix starting with a dot that all names share."""
    if not names:
        return ""
    first, rest = names[0], names[1:]
    for start in range(len(first)):
        suffix = first[start:]
        if suffix.startswith(".") and all(n.endswith(suffix) for n in rest):
            return suffix
    return ""


def job_sets(steps: list[MoveStep]) -> list[list[MoveStep]]:
    """Ganeti's `splitJobs`: the moves, newest first, join the current job set while they
    touch none of its nodes; the sets come out oldest first."""
    sets: list[list[MoveStep]] = []
    busy: set = set()
    for step in reversed(steps):
        nodes = set(step.new_nodes) | set(step.old_nodes)
        if sets and not nodes & busy:
            sets[0].insert(0, step)
            busy |= nodes
        else:
            sets.insert(0, [step])
            busy = nodes
    return sets


def ganeti_report(
    cluster: GCluster,
    result: HbalResult,
    group: str | None,
    print_commands: str | None,
    ignore_soft_errors: bool = False,
    min_score: float = 1e-9,
) -> list[str]:
    """What Ganeti's ``hbal`` prints on stdout for this plan (default verbosity): the load and
    group lines, the moves, the outcome and, with ``print_commands="-"``, the job sets.
    ``print_commands`` naming a file writes hbal's shell script there instead."""
    scope = _scope(cluster, group)
    in_scope = set(scope)
    insts = [i for i in cluster.instances if i.pnode in in_scope]
    suffix = _common_suffix([n.name for n in cluster.nodes] + [i.name for i in cluster.instances])

    def alias(name: str) -> str:
        return name[: -len(suffix)] if suffix and name.endswith(suffix) else name

    gname = cluster.groups[cluster.nodes[scope[0]].group].name if scope else (group or "")
    bad = [cluster.nodes[i] for i in scope if not cluster.nodes[i].offline and cluster.nodes[i].fail_n1]
    bad_idx = {n.idx for n in bad}
    bad_insts = [i for i in cluster.instances if i.pnode in bad_idx or i.snode in bad_idx]
    lines = [
        f"Loaded {len(cluster.nodes)} nodes, {len(cluster.instances)} instances",
        f"Group size {len(scope)} nodes, {len(insts)} instances",
        f"Selected node group: {gname}",
        f"Initial check done: {len(bad)} bad nodes, {len(bad_insts)} bad instances.",
    ]
    if bad:
        lines.append("Cluster is not N+1 happy, continuing but no guarantee that the cluster will end N+1 happy.")
    # Ganeti's getPolicyHealth on the other nodes: spindles over the limit, vCPU ratio over the policy.
    violating = [
        n
        for n in (cluster.nodes[i] for i in scope)
        if n.idx not in bad_idx and (n.inst_spindles > n.hi_spindles or n.p_cpu > n.vcpu_ratio)
    ]
    if violating:
        lines.append(f"The cluster contains {len(violating)} policy-violating nodes.")
        lines.append(
            "Continuing, ignoring soft errors."
            if ignore_soft_errors
            else "Continuing, but the set of moves might be too restricted;"
            " consider using the --ignore-soft-errors option."
        )
    lines.append(f"Initial score: {ganeti_float(result.initial_score)}")
    optimal = optimal_score(cluster, group)
    if result.initial_score - optimal < min_score:
        return [
            *lines,
            f"Cluster is already well balanced (initial score {haskell_g6(result.initial_score)},",
            f"optimum score due to N+1 reservations {haskell_g6(optimal)},",
            f"minimum score {haskell_g6(min_score)}).",
            "Nothing to do, exiting",
        ]
    lines.append("Trying to minimize the CV...")
    imlen = max((len(alias(i.name)) for i in insts), default=0)
    pmlen = 2 * max((len(alias(cluster.nodes[i].name)) for i in scope), default=0) + 1
    for number, step in enumerate(result.steps, start=1):
        old = ":".join(alias(n) for n in step.old_nodes)
        new = ":".join(alias(n) for n in step.new_nodes)
        inst, value = alias(step.instance), ganeti_float(step.score).rjust(12)
        lines.append(f"  {number:3d}. {inst:<{imlen}} {old:<{pmlen}} => {new:<{pmlen}} {value} a={step.move}")
    if result.steps:
        lines.append(
            f"Cluster score improved from {ganeti_float(result.initial_score)} to {ganeti_float(result.final_score)}"
        )
    else:
        lines.append("No solution found")
    lines.append(f"Solution length={len(result.steps)}")
    if print_commands is None:
        return lines
    script = []
    for number, jobs in enumerate(job_sets(result.steps), start=1):
        script += ["", f"echo jobset {number}, {len(jobs)} jobs"]
        for job, step in enumerate(jobs, start=1):
            script.append(f"  echo job {number}/{job}")
            script.append("  check")
            script += ["  gnt-instance " + " ".join(alias(w) for w in c.split(" ")) for c in step.commands]
    if print_commands == "-":
        lines += ["", "Commands to run to reach the above solution:"]
        lines += ["  " + line for line in script if line != "  check"]
    else:
        with open(print_commands, "w") as handle:
            handle.write(_SH_TEMPLATE + "".join(line + "\n" for line in script))
        lines.append(f"The commands have been written to file '{print_commands}'")
    return lines


_SH_TEMPLATE = (
    "#!/bin/sh\n\n"
    "# Auto-generated script for executing cluster rebalancing\n\n"
    "# To stop, touch the file /tmp/stop-htools\n\n"
    "set -e\n\n"
    "check() {\n"
    "  if [ -f /tmp/stop-htools ]; then\n"
    "    echo 'Stop requested, exiting'\n"
    "    exit 0\n"
    "  fi\n"
    "}\n\n"
)
