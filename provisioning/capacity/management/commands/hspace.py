"""``manage.py hspace``: capacity planning, as Ganeti's hspace (same input, same HTS_ keys)."""

import json

from django.core.management.base import BaseCommand, CommandError

from provisioning.placement.ganeti.hspace import HSpaceOptions, Spec, run_hspace

from ._ganeti_input import add_source_arguments, ganeti_cluster


class Command(BaseCommand):
    help = "How many more instances of a spec fit (tiered and standard allocation), and what runs out first."

    def add_arguments(self, parser):
        add_source_arguments(parser, simulate_option=True)
        parser.add_argument("--tiered-alloc", metavar="DISK,MEM,CPUS", help="start at this spec and shrink")
        parser.add_argument("--standard-alloc", metavar="DISK,MEM,CPUS", help="fixed spec until the first refusal")
        parser.add_argument("--disk-template", default="plain", help="plain, diskless, file, drbd, … (default plain)")
        parser.add_argument("--no-capacity-checks", action="store_true", help="skip the N+1 re-creatability check")
        parser.add_argument("--machine-readable", action="store_true", help="HTS_ key=value lines, as hspace")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **opts):
        try:
            tiered = Spec.parse(opts["tiered_alloc"]) if opts["tiered_alloc"] else None
            standard = Spec.parse(opts["standard_alloc"]) if opts["standard_alloc"] else None
        except ValueError as error:
            raise CommandError(str(error)) from None
        cluster = ganeti_cluster(opts, template=opts["disk_template"])
        options = HSpaceOptions(
            disk_template=opts["disk_template"], tiered=tiered, standard=standard,
            capacity=not opts["no_capacity_checks"],
        )  # fmt: skip
        try:
            result = run_hspace(cluster, options)
        except ValueError as error:
            raise CommandError(str(error)) from None
        if opts["machine_readable"]:
            self.stdout.write("\n".join(result.hts_lines()))
        elif opts["json"]:
            self.stdout.write(json.dumps(result.to_dict(), indent=2, default=str))
        else:
            self.stdout.write(result.summary())
