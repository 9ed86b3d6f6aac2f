"""``manage.py worker_check --live|--ready``: exit 0 when this machine's job workers are live
(ready), 1 with the reason otherwise; for supervisors and container health checks."""

from django.core.management.base import BaseCommand

from monitoring import worker_health


class Command(BaseCommand):
    help = "Exit 0 if this machine's job workers are live (--live) or ready to take jobs (--ready), else 1."

    def add_arguments(self, parser):
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("--live", action="store_true", help="a worker process beats")
        which.add_argument("--ready", action="store_true", help="live, and it reaches the database and broker")

    def handle(self, *args, live, ready, **options):
        found = worker_health.problems(ready=ready)
        what = "ready" if ready else "live"
        if found:
            self.stderr.write(f"workers not {what}: " + "; ".join(found))
            raise SystemExit(1)
        count = len(worker_health.beats())
        self.stdout.write(f"workers {what}: {count} process{'es' if count != 1 else ''}")
