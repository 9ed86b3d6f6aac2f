"""``manage.py hsqueeze``: which hosts can be emptied and powered off at low load, and how.

The work is `capacity.htools` (shared with the Django-free path that the htools command
takes for ``-t FILE``); this adds the live inventory as a source."""

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from capacity import htools
from capacity.management.commands._ganeti_input import ganeti_cluster


class Command(BaseCommand):
    help = "Consolidate: the hosts to empty (or bring back) and the move plan."

    def add_arguments(self, parser):
        htools.add_arguments("hsqueeze", parser)
        parser.add_argument(
            "-X",
            "--exec",
            dest="execute",
            action="store_true",
            help="execute: move the VMs, then power the emptied hosts off",
        )
        parser.add_argument("--reason", default="", help="with -X: why; rate-limit:N:label caps moves at once")

    def handle(self, *args, **opts):
        if opts["execute"]:
            if opts["ganeti_file"] or opts["at"]:
                raise CommandError("-X executes on the live cluster now: not with -t/--ganeti-file or --at")
            thresholds = [
                "--target-resources",
                str(opts["target_resources"]),
                "--minimal-resources",
                str(opts["minimal_resources"]),
            ]
            return call_command(
                "plan", "squeeze", "-X", "--reason", opts["reason"], *thresholds, stdout=self.stdout, stderr=self.stderr
            )

        def load(template, hold_future):
            return ganeti_cluster(opts, template=template, hold_future=hold_future)

        try:
            htools.run("hsqueeze", opts, load, self.stdout.write)
        except htools.CommandFailed as error:
            raise CommandError(str(error)) from None
