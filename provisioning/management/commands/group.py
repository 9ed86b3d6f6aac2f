"""``manage.py group``: node groups, mirroring Ganeti's ``gnt-group``.

    manage.py group list
    manage.py group evacuate NAME [--dry-run] [--reason "rate-limit:2:rack move"]

``evacuate`` moves every VM of the group to other groups (IAllocator ``change-group``), as a
plan (``manage.py plan evacuate-group``).
"""

from django.core.management import call_command
from django.core.management.base import BaseCommand

from inventory.models import NodeGroup


class Command(BaseCommand):
    help = "List node groups, or evacuate one (like gnt-group)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="command", required=True)
        sub.add_parser("list", help="list node groups")
        evacuate = sub.add_parser("evacuate", help="move every VM of the group to other groups")
        evacuate.add_argument("name")
        evacuate.add_argument("--dry-run", action="store_true", help="show the plan, move nothing")
        evacuate.add_argument("--reason", default="", help="rate-limit:N:label caps the migrations at N at once")

    def handle(self, *args, **options):
        if options["command"] == "list":
            for group in NodeGroup.objects.order_by("name"):
                self.stdout.write(f"{group.name:<24} {group.alloc_policy:<12} {group.hypervisors.count():>5} hosts")
            return
        extra = ["--dry-run"] if options["dry_run"] else []
        # Evacuating is a plan of moves: the plan command (provisioning, as this command).
        call_command(
            "plan",
            "evacuate-group",
            options["name"],
            "--reason",
            options["reason"],
            *extra,
            stdout=self.stdout,
            stderr=self.stderr,
        )
