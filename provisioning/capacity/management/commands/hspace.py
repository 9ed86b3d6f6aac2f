"""``manage.py hspace``: capacity planning, as Ganeti's hspace (same input, same HTS_ keys)."""

import json

from django.core.management.base import BaseCommand, CommandError

from provisioning.placement.ganeti import types as T
from provisioning.placement.ganeti.allocation import AllocError
from provisioning.placement.ganeti.hspace import HSpaceError, HSpaceOptions, Spec, run_hspace

from ._ganeti_input import add_source_arguments, ganeti_cluster


class Command(BaseCommand):
    help = "How many more instances of a spec fit (tiered and standard allocation), and what runs out first."

    def add_arguments(self, parser):
        add_source_arguments(parser, simulate_option=True)
        parser.add_argument("--tiered-alloc", metavar="DISK,MEM,CPUS", help="start at this spec and shrink")
        parser.add_argument("--standard-alloc", metavar="DISK,MEM,CPUS", help="fixed spec until the first refusal")
        parser.add_argument("--disk-template", default="plain", help=f"{', '.join(T.DISK_TEMPLATES)} (default plain)")
        parser.add_argument("--no-capacity-checks", action="store_true", help="skip the N+1 re-creatability check")
        parser.add_argument("--machine-readable", action="store_true", help="HTS_ key=value lines, as hspace")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **opts):
        specs = {}
        for option in ("tiered_alloc", "standard_alloc"):
            try:
                specs[option] = Spec.parse(opts[option]) if opts[option] else None
            except ValueError as error:
                raise CommandError(f"--{option.replace('_', '-')}: {error}") from None
        template = opts["disk_template"]
        if template not in T.DISK_TEMPLATES:  # as hspace: refused before any work
            raise CommandError(
                f'--disk-template: Invalid string value for type DiskTemplate: "{template}"'
                f" (one of {', '.join(T.DISK_TEMPLATES)})"
            )
        cluster = ganeti_cluster(opts, template=template)
        options = HSpaceOptions(
            disk_template=template, tiered=specs["tiered_alloc"], standard=specs["standard_alloc"],
            capacity=not opts["no_capacity_checks"],
        )  # fmt: skip
        try:
            result = run_hspace(cluster, options)
        except HSpaceError as error:
            # As hspace: what it printed before the failure, then the error, exit status 1.
            if opts["machine_readable"]:
                self.stdout.write("\n".join(error.lines))
            elif not opts["json"]:
                self.stdout.write("\n".join(error.summary_lines))
            raise CommandError(f"failure during allocation: {error}") from None
        except (AllocError, ValueError) as error:
            raise CommandError(str(error)) from None
        if opts["machine_readable"]:
            try:
                self.stdout.write("\n".join(result.hts_lines()))
            except HSpaceError as error:
                self.stdout.write("\n".join(error.lines))
                raise CommandError(str(error)) from None
        elif opts["json"]:
            self.stdout.write(json.dumps(result.to_dict(), indent=2, default=str))
        else:
            self.stdout.write(result.summary())
