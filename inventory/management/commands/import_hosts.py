"""``manage.py import_hosts FILE [--format csv|xlsx|json|yaml] [--dry-run]``

Imports hypervisors, all rows or none. Prints ``created N, updated M, errors K`` and every
error (``Row 12 memory_mib: must be a positive integer``). Exit status 0 on success, 1 when
the file or any row is refused (then nothing was written).
"""

import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from core.changelog import Actor
from inventory import formats, services


class Command(BaseCommand):
    help = "Import hypervisors from a CSV, XLSX, JSON or YAML file (all rows or none)."

    def add_arguments(self, parser):
        parser.add_argument("file", help="the file to import ('-' reads standard input; then give --format)")
        parser.add_argument("--format", choices=formats.FORMATS, help="default: from the file's extension")
        parser.add_argument("--dry-run", action="store_true", help="check and report; write nothing")
        parser.add_argument("--reason", default="", help="why (kept in the change log)")

    def handle(self, *args, **options):
        path = options["file"]
        fmt = options["format"] or formats.guess_format(path)
        if fmt is None:
            raise CommandError(f"cannot tell the format of {path!r} from its name: give --format")
        try:
            data = self.read(path)
        except formats.FileError as exc:
            report = services.ImportReport(dry_run=options["dry_run"], file_errors=[str(exc)])
        else:
            report = services.import_hypervisors(
                data,
                fmt,
                actor=Actor(name="cli"),
                dry_run=options["dry_run"],
                file_name=Path(path).name,
                reason=options["reason"],
            )
        for message in report.messages():
            self.stderr.write(message)
        self.stdout.write(report.summary())
        if not report.ok:
            raise CommandError("nothing was written", returncode=1)
        if report.dry_run:
            self.stdout.write("dry run: nothing was written")

    def read(self, path):
        if path == "-":
            data = sys.stdin.buffer.read(formats.max_bytes() + 1)
            formats.check_size(len(data))
            return data
        try:
            file = Path(path)
            formats.check_size(file.stat().st_size)
            return file.read_bytes()
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror}") from None
