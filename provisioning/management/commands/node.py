"""``manage.py node``: node states, mirroring Ganeti's ``gnt-node``.

    manage.py node list [--state drained] [--group G] [--blade-center BC] [--tag T]
    manage.py node modify NAME --drained=yes --reason "firmware upgrade"
    manage.py node modify NAME --offline=yes --reason "PSU failure"
    manage.py node modify NAME --drained=no --reason "back in service"   (→ online)
    manage.py node evacuate NAME [--dry-run] [--reason "rate-limit:4:maintenance"]

Exit status 0 when done (also when nothing needed changing), 1 on an error.
"""

from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from core.changelog import Actor
from inventory import services
from inventory.models import Hypervisor

YES_NO = {"yes": True, "no": False}


class Command(BaseCommand):
    help = "List nodes (hypervisors) or change their state, like gnt-node."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="command", required=True)
        listing = sub.add_parser("list", help="list hypervisors and their state")
        listing.add_argument("--state", choices=Hypervisor.State.values)
        listing.add_argument("--group")
        listing.add_argument("--blade-center")
        listing.add_argument("--tag")
        modify = sub.add_parser("modify", help="drain, offline or online a hypervisor")
        modify.add_argument("name")
        modify.add_argument("--drained", choices=YES_NO, help="yes: take no new VMs; no: back online")
        modify.add_argument("--offline", choices=YES_NO, help="yes: take nothing; no: back online")
        modify.add_argument("--reason", required=True, help="why (kept in the change log)")
        evacuate = sub.add_parser("evacuate", help="move every VM (and future claim) off a node, as a plan")
        evacuate.add_argument("name")
        evacuate.add_argument("--dry-run", action="store_true", help="show the plan, move nothing")
        evacuate.add_argument("--reason", default="", help="rate-limit:N:label caps the migrations at N at once")

    def handle(self, *args, **options):
        if options["command"] == "evacuate":
            # Evacuating is a plan of moves: the plan command (provisioning, as this command).
            extra = ["--dry-run"] if options["dry_run"] else []
            return call_command(
                "plan",
                "evacuate-node",
                options["name"],
                "--reason",
                options["reason"],
                *extra,
                stdout=self.stdout,
                stderr=self.stderr,
            )
        if options["command"] == "list":
            self.list(options)
        else:
            self.modify(options)

    def list(self, options):
        hosts = Hypervisor.objects.select_related("group", "blade_center").order_by("name")
        if options["state"]:
            hosts = hosts.filter(state=options["state"])
        if options["group"]:
            hosts = hosts.filter(group__name=options["group"])
        if options["blade_center"]:
            hosts = hosts.filter(blade_center__name=options["blade_center"])
        if options["tag"]:
            hosts = hosts.filter(tags__name=options["tag"])
        line = "{:<24} {:<8} {:<14} {:<14} {:>5} {:>9} {:>8}  {}"
        self.stdout.write(line.format("Node", "State", "Group", "Chassis/slot", "CPUs", "MemMiB", "DiskGiB", "Reason"))
        for host in hosts:
            where = f"{host.blade_center.name}/{host.slot}" if host.blade_center else "-"
            self.stdout.write(
                line.format(
                    host.name[:24],
                    host.state,
                    (host.group.name if host.group else "-")[:14],
                    where[:14],
                    host.cpus,
                    host.memory_mib,
                    host.disk_gib,
                    host.state_reason,
                )
            )

    def modify(self, options):
        drained, offline = options["drained"], options["offline"]
        if drained is None and offline is None:
            raise CommandError("give --drained=yes|no or --offline=yes|no")
        if drained == "yes" and offline == "yes":
            raise CommandError("a node is either drained or offline, not both")
        state = "offline" if offline == "yes" else "drained" if drained == "yes" else "online"
        try:
            host = Hypervisor.objects.get(name=options["name"])
        except Hypervisor.DoesNotExist:
            raise CommandError(f"no hypervisor named {options['name']!r}") from None
        try:
            changed = services.set_state(host, state, options["reason"], actor=Actor(name="cli"))
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        self.stdout.write(f"{host.name}: {state}" if changed else f"{host.name}: already {state}, nothing changed")
