"""``manage.py export_hosts [--format csv|xlsx|json|yaml] [--output FILE] [filters]``

Writes hypervisors in the format ``import_hosts`` reads back unchanged (round trip).
"""

import sys

from django.core.management.base import BaseCommand, CommandError

from inventory import formats, services
from inventory.api.filters import HypervisorFilterSet
from inventory.models import Hypervisor


class Command(BaseCommand):
    help = "Export hypervisors as CSV, XLSX, JSON or YAML (imports back unchanged)."

    def add_arguments(self, parser):
        parser.add_argument("--format", choices=formats.FORMATS, default=None, help="default: from --output, else csv")
        parser.add_argument("--output", "-o", default="-", help="file to write (default: standard output)")
        parser.add_argument("--no-id", action="store_true", help="leave out the id column (match by name only)")
        for name in ("group", "blade_center", "state", "driver", "tag"):
            parser.add_argument(
                f"--{name.replace('_', '-')}",
                action="append",
                dest=name,
                metavar=name.upper(),
                help=f"only hosts with this {name.replace('_', ' ')} (repeatable)",
            )

    def handle(self, *args, **options):
        output = options["output"]
        fmt = options["format"] or (formats.guess_format(output) if output != "-" else None) or "csv"
        if fmt == "xlsx" and output == "-" and sys.stdout.isatty():
            raise CommandError("XLSX is binary: give --output FILE")
        filters = {k: options[k] for k in ("group", "blade_center", "state", "driver", "tag") if options[k]}
        queryset = Hypervisor.objects.all()
        if filters:
            filterset = HypervisorFilterSet(_query(filters), queryset=queryset)
            if not filterset.is_valid():
                raise CommandError("; ".join(f"{k}: {' '.join(v)}" for k, v in filterset.errors.items()))
            queryset = filterset.qs
        body = services.export_hypervisors(fmt, queryset, with_id=not options["no_id"])
        if output == "-":
            self.stdout.flush()
            sys.stdout.buffer.write(body)
            sys.stdout.flush()
        else:
            try:
                with open(output, "wb") as file:
                    file.write(body)
            except OSError as exc:
                raise CommandError(f"cannot write {output}: {exc.strerror}") from None
            self.stderr.write(f"wrote {queryset.count()} hypervisors to {output}")


def _query(filters):
    from django.http import QueryDict

    query = QueryDict(mutable=True)
    for key, values in filters.items():
        query.setlist(key, values)
    return query
