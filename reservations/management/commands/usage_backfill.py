"""Store the usage report's and showback's per-day figures for past days from the history."""

from datetime import date, timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from reservations import rollup


class Command(BaseCommand):
    help = (
        "Fill the usage report's per-day tables (UsageDay, and showback's UsageRollup) for past days; "
        "re-running replaces them."
    )

    def add_arguments(self, parser):
        parser.add_argument("--from", dest="first", help="first day, YYYY-MM-DD (default: 365 days ago)")
        parser.add_argument("--to", dest="last", help="last day, YYYY-MM-DD (default: yesterday)")

    def handle(self, *args, first=None, last=None, **options):
        today = timezone.now().date()
        try:
            last = date.fromisoformat(last) if last else today - timedelta(days=1)
            first = date.fromisoformat(first) if first else today - timedelta(days=365)
        except ValueError:
            raise CommandError("--from / --to: give dates as YYYY-MM-DD") from None
        if first > last:
            raise CommandError("--from must not be after --to")
        days = rollup.backfill(first, last)
        self.stdout.write(f"stored {len(days)} day(s)")
