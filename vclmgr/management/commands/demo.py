"""``manage.py demo``: load demo data; safe to run again (nothing is duplicated)."""

from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils.module_loading import import_string

# Each app adds its step here; steps run in order, each as `step(stdout)`.
DEMO_STEPS = [
    "vclmgr.demo.users",
    "inventory.demo.blade_center",
    "provisioning.demo.images",
    "reservations.demo.reservations",
    "runs.demo.runs",
    "jobs.demo.jobs",
]


class Command(BaseCommand):
    help = "Load demo data (idempotent)."

    def handle(self, *args, **options):
        self.stdout.write("Demo data:")
        for dotted in DEMO_STEPS:
            with transaction.atomic():
                import_string(dotted)(self.stdout)
