"""``manage.py hbal``: a move plan that lowers the cluster score, as Ganeti's hbal (faster).

The work is `capacity.htools` (shared with the Django-free path that the htools command
takes for ``-t FILE``); this adds the live inventory as a source."""

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from capacity import htools
from capacity.management.commands._ganeti_input import ganeti_cluster


class Command(BaseCommand):
    help = "Plan VM moves that even out the cluster; never onto drained or offline hosts."

    def add_arguments(self, parser):
        htools.add_arguments("hbal", parser)
        parser.add_argument("-L", "--luxi", action="store_true", help="the live cluster (the default without -t)")
        parser.add_argument(
            "-X",
            "--exec",
            dest="execute",
            action="store_true",
            help="execute the moves as jobs (a stored plan: manage.py plan)",
        )
        parser.add_argument("--reason", default="", help="with -X: why; rate-limit:N:label caps moves at once")

    def handle(self, *args, **opts):
        if opts["execute"]:
            if opts["ganeti_file"] or opts["at"]:
                raise CommandError("-X executes on the live cluster now: not with -t/--ganeti-file or --at")
            # -X stores a plan and runs it: the plan command does that (provisioning, as this command).
            extra = ["-G", opts["group"]] if opts["group"] else []
            return call_command(
                "plan",
                "balance",
                "-X",
                "--max-moves",
                str(opts["max_moves"]),
                "--reason",
                opts["reason"],
                *extra,
                stdout=self.stdout,
                stderr=self.stderr,
            )

        def load(template, hold_future):
            return ganeti_cluster(opts, template=template, hold_future=hold_future)

        try:
            htools.run("hbal", opts, load, self.stdout.write)
        except htools.CommandFailed as error:
            raise CommandError(str(error)) from None
