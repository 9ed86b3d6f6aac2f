"""``manage.py hsqueeze``: which hosts can be emptied and powered off at low load, and how."""

import json

from django.core.management.base import BaseCommand, CommandError

from provisioning.placement.ganeti.hsqueeze import squeeze

from ._ganeti_input import add_source_arguments, ganeti_cluster


class Command(BaseCommand):
    help = "Consolidate: the hosts to empty (or bring back) and the move plan."

    def add_arguments(self, parser):
        add_source_arguments(parser)
        # --target-resources is hsqueeze's spelling; --target-util is kept as an alias.
        parser.add_argument("--target-resources", "--target-util", dest="target_resources", type=float, default=2.0,
                            help="free capacity to keep, in standard instances per host (as hsqueeze)")  # fmt: skip
        parser.add_argument("--minimal-resources", type=float, default=2.0,
                            help="below this free capacity per host, bring hosts back (as hsqueeze)")  # fmt: skip
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **opts):
        for option in ("target_resources", "minimal_resources"):
            value = opts[option]
            if not value > 0 or value == float("inf"):  # also refuses nan and inf
                raise CommandError(f"--{option.replace('_', '-')} must be a positive number, got {value}")
        cluster = ganeti_cluster(opts, template="ext", hold_future=True)
        result = squeeze(
            cluster, target_resources=opts["target_resources"], minimal_resources=opts["minimal_resources"]
        )
        if opts["json"]:
            self.stdout.write(json.dumps(result.to_dict(), indent=2))
            return
        if result.action == "none":
            self.stdout.write("Nothing to do: no host can be emptied, none needs to come back.")
            return
        verb = "Power off" if result.action == "offline" else "Bring back online"
        self.stdout.write(f"{verb}: {', '.join(result.nodes)}")
        for number, step in enumerate(result.moves, start=1):
            self.stdout.write(step.line(number))
