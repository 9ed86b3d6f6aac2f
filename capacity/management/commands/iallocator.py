"""``manage.py iallocator REQUEST.json``: vclmgr's allocator as a Ganeti IAllocator program."""

import json
import sys
from pathlib import Path

from django.core.management.base import BaseCommand

from placement.ganeti.iallocator import dumps_response, handle_iallocator_request


class Command(BaseCommand):
    help = "Answer a Ganeti IAllocator request (allocate, multi-allocate, relocate, node-evacuate, change-group)."

    def add_arguments(self, parser):
        parser.add_argument("request", help="the request file Ganeti writes ('-' for standard input)")
        parser.add_argument("--no-capacity-checks", action="store_true")
        parser.add_argument("--ignore-soft-errors", action="store_true")

    def handle(self, *args, request, no_capacity_checks, ignore_soft_errors, **options):
        try:
            text = sys.stdin.read() if request == "-" else Path(request).read_text()
            data = json.loads(text)
            if not isinstance(data, dict):
                raise ValueError("the request must be a JSON object")
            response = handle_iallocator_request(
                data, capacity_checks=not no_capacity_checks, ignore_soft_errors=ignore_soft_errors
            )
        except (OSError, ValueError, KeyError, TypeError) as error:  # as hail: exit 1, "Error: …"
            self.stderr.write(f"Error: {error}")
            raise SystemExit(1) from None
        self.stdout.write(dumps_response(response))
