"""``manage.py discover vcenter|libvirt …``: find hypervisors through their own APIs.

discover vcenter --url https://USER@vcenter.example.org/sdk [--password-file F | --password-env VAR]
                 [--credential NAME] [--group G] [--commit]
discover libvirt URI… [--credential NAME] [--group G] [--commit]

Prints one line per host found and what a commit does with it (create / update / unchanged /
reject). Without ``--commit`` nothing is written. With it, the hosts are registered or updated
through the bulk import (all or none), a vCenter password is stored as a credential, and the
reported facts are kept on each host. The password is read from a file or an environment
variable (default ``VCLMGR_VCENTER_PASSWORD``), never from the command line.
"""

import os
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from core.changelog import Actor
from inventory.discovery import services

PASSWORD_ENV = "VCLMGR_VCENTER_PASSWORD"  # noqa: S105 (a variable's name)


class Command(BaseCommand):
    help = "Discover hypervisors (a vCenter's hosts, libvirt URIs); --commit registers them."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="kind", required=True)
        vcenter = sub.add_parser("vcenter", help="every host a vCenter (or ESXi) manages")
        vcenter.add_argument("--url", required=True, help="https://user@vcenter/sdk")
        vcenter.add_argument("--password-file", help="file holding the password")
        vcenter.add_argument("--password-env", default=PASSWORD_ENV, help=f"variable holding it ({PASSWORD_ENV})")
        libvirt = sub.add_parser("libvirt", help="one host per libvirt URI")
        libvirt.add_argument("uris", nargs="+", metavar="URI")
        for kind in (vcenter, libvirt):
            kind.add_argument("--credential", help="an existing credential to connect with and record")
            kind.add_argument("--group", help="node group for the hosts")
            kind.add_argument("--commit", action="store_true", help="register or update them (default: preview)")
            kind.add_argument("--reason", default="")

    def handle(self, *args, kind, **options):
        if kind == "vcenter":
            driver, uris, password = "vmware", [options["url"]], self.password(options)
        else:
            driver, uris, password = "libvirt", options["uris"], ""
        try:
            found = services.discover(
                driver,
                uris,
                actor=Actor(name="cli"),
                password=password,
                credential=options["credential"],
                group=options["group"],
                commit=options["commit"],
                reason=options["reason"],
            )
        except services.DiscoveryError as exc:
            raise CommandError(f"discovery failed, nothing was written: {exc}") from None
        self.table(found.as_dict())

    def password(self, options):
        if options["password_file"]:
            try:
                return Path(options["password_file"]).read_text().strip()
            except OSError as exc:
                raise CommandError(f"cannot read {options['password_file']}: {exc.strerror}") from None
        return os.environ.get(options["password_env"], "")

    def table(self, result):
        columns = ("action", "name", "address", "cpus", "memory_mib", "disk_gib", "vms", "uri")
        rows = [[str(host.get(c) if host.get(c) is not None else "-") for c in columns] for host in result["hosts"]]
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
        for line in [list(columns), *rows]:
            self.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
        for message in result["errors"]:
            self.stderr.write(message)
        self.stdout.write(result["summary"])
        if not result["ok"]:
            raise CommandError("nothing was written", returncode=1)
        if result["credential_created"] and result["committed"]:
            self.stdout.write(f"stored the password as credential {result['credential']}")
        self.stdout.write("committed" if result["committed"] else "preview only: --commit writes it")
