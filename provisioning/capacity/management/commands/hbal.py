"""``manage.py hbal``: a move plan that lowers the cluster score, as Ganeti's hbal (faster)."""

import json

from django.core.management.base import BaseCommand, CommandError

from provisioning.placement.ganeti.hbal import HbalOptions, balance

from ._ganeti_input import add_source_arguments, ganeti_cluster


class Command(BaseCommand):
    help = "Plan VM moves that even out the cluster; never onto drained or offline hosts."

    def add_arguments(self, parser):
        add_source_arguments(parser)
        parser.add_argument("-G", "--group", metavar="NAME", help="the node group to balance (name or UUID), as hbal")
        parser.add_argument("--max-moves", type=int, default=-1, help="stop after N moves (default: converge)")
        parser.add_argument("-C", "--print-commands", action="store_true", help="print gnt-instance commands")
        parser.add_argument(
            "--strategy",
            choices=("auto", "steepest", "lazy", "both"),
            default="auto",
            help="steepest: Ganeti's own path (the best move every round); lazy: re-rank candidates "
            "lazily (for very large clusters); both: keep the better end; auto: both on small "
            "clusters, steepest up to a million candidate moves, else lazy",
        )
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **opts):
        if opts["max_moves"] < -1:
            raise CommandError(f"--max-moves must be 0 or more (or -1: converge), got {opts['max_moves']}")
        # Live VMs migrate to any host (shared-storage semantics in Ganeti's terms).
        cluster = ganeti_cluster(opts, template="ext", hold_future=True)
        group = opts["group"]
        names = [cluster.groups[g].name for g in sorted({n.group for n in cluster.nodes})]
        if group is not None and not any(group in (g.name, g.uuid) for g in cluster.groups):
            raise CommandError(f"Node group {group} not found. Node group list is: {', '.join(names)}")
        if group is None and len(names) > 1:
            raise CommandError(f"Found multiple node groups: {', '.join(names)}; choose one with -G/--group")
        options = HbalOptions(max_moves=opts["max_moves"], strategy=opts["strategy"], group=group)
        try:
            result = balance(cluster, options)
        except (KeyError, ValueError) as error:
            raise CommandError(error.args[0] if error.args else str(error)) from None
        if opts["json"]:
            self.stdout.write(json.dumps(result.to_dict(), indent=2))
            return
        self.stdout.write(f"Initial score: {result.initial_score:.8f}")
        for number, step in enumerate(result.steps, start=1):
            self.stdout.write(step.line(number))
        self.stdout.write(f"Cluster score improved from {result.initial_score:.8f} to {result.final_score:.8f}")
        self.stdout.write(f"Solution length={len(result.steps)}")
        if opts["print_commands"]:
            self.stdout.write("\n".join(result.commands()))
