"""``manage.py revision …``: an image's revisions from the command line (``provisioning.revisions``).

revision list IMAGE [--json]
revision add IMAGE --variant TYPE,FORMAT,LOCATION[,CHECKSUM] [--variant …] [--comment TEXT] [--parent N]
    [--kernel PATH[,CHECKSUM] [--initrd PATH[,CHECKSUM]] [--kernel-args TEXT]]  (direct kernel boot)
revision production IMAGE N        # new VMs are built from revision N (the roll-back, or forward)
revision retire IMAGE N
revision delete IMAGE N            # its copies on hosts are removed by image.unstage jobs

The verbs of an image's template (template, publish, discard, test) are the reservations
app's, registered into ``VERBS`` at start-up (``reservations.revision_cli``).
"""

import json

from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management.base import BaseCommand, CommandError

from core.changelog import Actor
from core.errors import Conflict
from core.hooks import Hook
from provisioning import revisions, services
from provisioning.api.serializers import ImageRevisionSerializer
from provisioning.models import Image, ImageRevision

CLI = Actor(name="cli")
CHANGES = {"production": revisions.make_production, "retire": revisions.retire}
# Verbs of the layers above (an image's template: reservations), filled in their ready():
# verb -> ``(help, add_arguments(parser), run(command, image, options) -> the line to print)``.
VERBS: Hook[tuple] = Hook("provisioning.management.commands.revision.VERBS", keyed=True, single=True)


class Command(BaseCommand):
    help = "List, add, make production, retire and delete an image's revisions."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="verb", required=True)
        listing = sub.add_parser("list")
        listing.add_argument("image", help="image name")
        listing.add_argument("--json", action="store_true")
        add = sub.add_parser("add")
        add.add_argument("image", help="image name")
        add.add_argument(
            "--variant",
            action="append",
            required=True,
            metavar="TYPE,FORMAT,LOCATION[,CHECKSUM]",
            help="one disk of the revision (repeat for each hypervisor type)",
        )
        add.add_argument("--kernel", metavar="LOCATION[,CHECKSUM]", help="direct kernel boot: the kernel")
        add.add_argument("--initrd", metavar="LOCATION[,CHECKSUM]", help="and its initrd")
        add.add_argument("--kernel-args", default="", metavar="TEXT", help="and its command line")
        add.add_argument("--comment", default="")
        add.add_argument("--parent", type=int, help="the revision it was made from (default: production)")
        for verb in ("production", "retire", "delete"):
            act = sub.add_parser(verb)
            act.add_argument("image", help="image name")
            act.add_argument("number", type=int)
        for verb, (text, arguments, _) in VERBS.items():
            more = sub.add_parser(verb, help=text)
            more.add_argument("image", help="image name")
            arguments(more)

    def handle(self, *args, verb, **options):
        image = Image.objects.filter(name=options["image"]).first()
        if image is None:
            raise CommandError(f"no image named {options['image']!r}")
        try:
            if verb == "list":
                return self.list(image, options["json"])
            if VERBS.one(verb) is not None:
                self.stdout.write(VERBS.one(verb)[2](self, image, options))
            elif verb == "add":
                revision = services.add_revision(
                    image,
                    actor=CLI,
                    variants=[{**_variant(text), **_kernel(options)} for text in options["variant"]],
                    parent=self.revision(image, options["parent"]) if options["parent"] else None,
                    comment=options["comment"],
                )
                self.stdout.write(f"{image.name} revision {revision.number} added ({revision.state})")
            elif verb == "delete":
                jobs = revisions.delete_revision(self.revision(image, options["number"]), actor=CLI)
                ids = ", ".join(str(job.pk) for job in jobs) or "none"
                self.stdout.write(f"{image.name} revision {options['number']} deleted (image.unstage jobs: {ids})")
            else:
                revision = CHANGES[verb](self.revision(image, options["number"]), actor=CLI)
                self.stdout.write(f"{image.name} revision {revision.number} is {revision.state}")
        except ValidationError as exc:
            raise CommandError("; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())) from None
        except (Conflict, PermissionDenied) as exc:
            raise CommandError(str(exc)) from None

    def list(self, image, as_json):
        rows = image.revisions.select_related("created_by").prefetch_related("variants").order_by("number")
        if as_json:
            self.stdout.write(json.dumps(ImageRevisionSerializer(rows, many=True).data, indent=2, default=str))
            return
        for revision in rows:
            types = ", ".join(v.hypervisor_type for v in revision.variants.all()) or "no variant"
            by = revision.created_by.get_username() if revision.created_by else "-"
            used = revisions.in_use(revision) or "unused"
            self.stdout.write(
                f"{revision.number:>4}  {revision.state:<10}  {revision.created:%Y-%m-%d %H:%M}  {by:<12}  "
                f"{types}  ({used})  {revision.comment}".rstrip()
            )

    def revision(self, image, number):
        found = ImageRevision.objects.filter(image=image, number=number).first()
        if found is None:
            raise CommandError(f"{image.name} has no revision {number}")
        return found


def _variant(text):
    parts = [part.strip() for part in text.split(",", 3)]
    if len(parts) < 3:
        raise CommandError(f"--variant {text!r}: give TYPE,FORMAT,LOCATION[,CHECKSUM]")
    return dict(zip(("hypervisor_type", "format", "location", "checksum"), parts, strict=False))


def _kernel(options):
    """The kernel settings given, for every variant of the revision (direct kernel boot)."""
    fields = {"kernel_args": options["kernel_args"]} if options["kernel_args"] else {}
    for role in ("kernel", "initrd"):
        if options[role]:
            location, _, checksum = options[role].partition(",")
            fields.update({role: location.strip(), f"{role}_checksum": checksum.strip()})
    return fields
