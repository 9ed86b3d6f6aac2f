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
from .metrics import KINDS, ONLINE, WEIGHTS, node_values, score
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
    #: STEEPEST_LIMIT (it holds every candidate in memory, about 1 KB each), else lazy.
    strategy: str = "auto"


#: Largest move neighbourhood for which "auto" also runs the steepest strategy.
AUTO_BOTH_LIMIT = 3000
#: Largest move neighbourhood for which "auto" runs the steepest strategy (about 1 GB).
STEEPEST_LIMIT = 1_000_000


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
    if opts.strategy not in ("auto", "lazy", "steepest", "both"):
        raise ValueError(f"unknown strategy {opts.strategy!r}: use auto, lazy, steepest or both")
    strategies = {"lazy": [False], "steepest": [True], "both": [False, True]}.get(opts.strategy)
    if strategies is None:
        probe = _GanetiProblem(cluster, scope, opts)
        size = sum(len(probe.moves(i)) for i in probe.items())
        if size <= AUTO_BOTH_LIMIT:
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
