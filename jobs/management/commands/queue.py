"""``manage.py queue [--limit N] [--lease SECONDS] [--max-attempts N]``: show or tune the job queue.

Changes take effect at the next dispatch, without restarting anything.
"""

import json

from django.core.management.base import BaseCommand

from jobs import services
from jobs.management.commands.job import CLI, service_errors


class Command(BaseCommand):
    help = "Show the job queue, or tune it (--limit N: at most N jobs run at once)."

    def add_arguments(self, parser):
        # Strings, so that "abc" or "1.5" get the service's clear message, not argparse's.
        parser.add_argument("--limit", help="at most this many jobs run at once")
        parser.add_argument("--lease", help="seconds before a silent worker's job is recovered")
        parser.add_argument("--max-attempts", help="attempts per job (a lost worker costs one)")
        parser.add_argument("--reason", default="")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **options):
        wanted = {"limit": options["limit"], "lease_seconds": options["lease"], "max_attempts": options["max_attempts"]}
        if any(value is not None for value in wanted.values()):
            with service_errors():
                services.set_queue_settings(actor=CLI, reason=options["reason"], **wanted)
        state = services.queue_state()
        if options["json"]:
            self.stdout.write(json.dumps(state, indent=2))
            return
        self.stdout.write(
            f"limit {state['limit']} · lease {state['lease_seconds']} s · max attempts {state['max_attempts']}\n"
            f"running {state['running']} · queued {state['queued']} · waiting {state['waiting']}"
            f" (of which {state['awaiting_children']} wait for children)"
        )
        for bucket in state["buckets"]:
            self.stdout.write(f"bucket {bucket['label']!r}: {bucket['running']} of {bucket['size']} running")
