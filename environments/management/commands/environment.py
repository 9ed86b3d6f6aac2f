"""``manage.py environment …``: environment templates from the command line.

environment list [--user NAME] [--json]
environment show NAME [--json]
environment create --from-file env.yaml --user NAME
environment delete NAME --user NAME

``create`` reads one template from YAML (docs/user/environments.md shows one): its name,
description, members (name, image by name, revision by number, count, vcpus, memory_mib, disk_gib, entry, networks)
and networks (name, cidr); the template is ``--user``'s, who must be allowed to use its images.
``delete`` acts as ``--user`` (its owner, or an administrator).
"""

import json

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management.base import BaseCommand, CommandError

from core import yamlsafe
from core.errors import Conflict
from environments import services
from environments.api.serializers import TemplateSerializer
from environments.models import EnvironmentTemplate

TOP = {"name", "description", "members", "networks"}
MEMBER = {"name", "image", "revision", "count", "vcpus", "memory_mib", "disk_gib", "entry", "networks"}
NETWORK = {"name", "cidr"}


class Command(BaseCommand):
    help = "List, show, create (from a YAML file) and delete environment templates."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="verb", required=True)
        listing = sub.add_parser("list")
        listing.add_argument("--user", help="only the templates this user may use")
        listing.add_argument("--json", action="store_true")
        show = sub.add_parser("show")
        show.add_argument("name")
        show.add_argument("--json", action="store_true")
        show.add_argument("--user", help="as this user sees it (images they may not see left out)")
        show.add_argument("--owner", help="whose template of that name (names are unique per owner)")
        create = sub.add_parser("create")
        create.add_argument("--from-file", required=True, dest="path", help="a YAML file of one template")
        create.add_argument("--user", required=True, help="its owner")
        delete = sub.add_parser("delete")
        delete.add_argument("name")
        delete.add_argument("--user", required=True, help="who deletes it (its owner or an administrator)")
        delete.add_argument("--owner", help="whose template of that name (names are unique per owner)")

    def handle(self, *args, verb, **options):
        try:
            getattr(self, verb)(options)
        except ValidationError as exc:
            raise CommandError("; ".join(_lines(exc))) from None
        except (PermissionDenied, Conflict) as exc:
            raise CommandError(str(exc)) from None

    def list(self, options):
        rows = EnvironmentTemplate.objects.all()
        if options["user"]:
            rows = services.visible_templates(self.user(options["user"]))
        rows = rows.select_related("owner").prefetch_related("members", "groups").order_by("name")
        if options["json"]:
            self.stdout.write(json.dumps([_brief(t) for t in rows], indent=2))
            return
        for template in rows:
            brief = _brief(template)
            self.stdout.write(
                f"{brief['name']:30} {brief['machines']:>3} machines  {brief['visibility']:10} {brief['owner'] or '-'}"
            )

    def show(self, options):
        viewer = self.user(options["user"]) if options["user"] else None
        template = self.template(options["name"], viewer=viewer, owner=options["owner"])
        if options["json"]:
            data = TemplateSerializer(template, context={"viewer": viewer}).data
            self.stdout.write(json.dumps(data, indent=2, default=str))
            return
        self.stdout.write(f"{template.name}: {template.description or '(no description)'}")
        self.stdout.write(f"owner {template.owner or '-'}, {template.visibility}")
        machines = services.expand(template)
        hidden = services.hidden_images(viewer, machines) if viewer is not None else set()
        for machine in machines:
            image = "(an image not visible)" if machine.image.pk in hidden else _image(machine)
            self.stdout.write(
                f"  {machine.hostname:24} {image:24} {machine.vcpus} vCPUs {machine.memory_mib} MiB "
                f"{machine.disk_gib} GiB  on {', '.join(machine.networks) or '-'}{'  (entry)' if machine.entry else ''}"
            )
        for network in template.networks.all():
            self.stdout.write(f"  network {network.name} {network.cidr}")

    def create(self, options):
        user = self.user(options["user"])
        try:
            with open(options["path"], encoding="utf-8") as handle:
                data = yamlsafe.load(handle.read())
        except OSError as exc:
            raise CommandError(f"{options['path']}: {exc.strerror}") from None
        except yamlsafe.yaml.YAMLError as exc:
            raise CommandError(f"{options['path']}: not YAML: {exc}") from None
        fields = _shaped(data)
        template = services.create_template(actor=user, reason="CLI", **fields)
        self.stdout.write(f"created {template.name} ({sum(m.count for m in template.members.all())} machines)")

    def delete(self, options):
        template = self.template(options["name"], owner=options["owner"])
        services.delete_template(template, actor=self.user(options["user"]), reason="CLI")
        self.stdout.write(f"deleted {options['name']}")

    def user(self, name):
        user = get_user_model().objects.filter(username=name).first()
        if user is None:
            raise CommandError(f"no user named {name!r}")
        return user

    def template(self, name, viewer=None, owner=None):
        """The template named ``name`` (among those ``viewer`` may use; of ``owner``): names are
        unique per owner, so one that several owners use needs ``--owner``."""
        rows = EnvironmentTemplate.objects.all() if viewer is None else services.visible_templates(viewer)
        rows = rows.filter(name=name).select_related("owner")
        if owner:
            rows = rows.filter(owner__username=owner)
        found = list(rows[:2])
        if not found:
            raise CommandError(f"no environment template named {name!r}")
        if len(found) > 1:
            if viewer is not None and any(t.owner_id == viewer.pk for t in found):
                return next(t for t in found if t.owner_id == viewer.pk)
            raise CommandError(f"several templates are named {name!r}: say whose with --owner")
        return found[0]


def _image(machine):
    return f"{machine.image.name} r{machine.revision.number}" if machine.revision else machine.image.name


def _brief(template):
    return {
        "name": template.name,
        "machines": sum(m.count for m in template.members.all()),
        "visibility": template.visibility,
        "owner": template.owner.username if template.owner else None,
    }


def _shaped(data):
    """The file's template as the service takes it; its shape refused in the file's own terms."""
    if not isinstance(data, dict):
        raise CommandError("the file must be one mapping: name, description, members, networks")
    _known(data, TOP, "the template")
    members, networks = data.get("members") or [], data.get("networks") or []
    if not isinstance(members, list) or not isinstance(networks, list):
        raise CommandError("members and networks must be lists")
    for i, member in enumerate(members, 1):
        if not isinstance(member, dict):
            raise CommandError(f"member {i}: must be a mapping")
        _known(member, MEMBER, f"member {i}")
        if not isinstance(member.get("networks", []), list):
            raise CommandError(f"member {i}: networks must be a list of names")
    for i, network in enumerate(networks, 1):
        if not isinstance(network, dict):
            raise CommandError(f"network {i}: must be a mapping")
        _known(network, NETWORK, f"network {i}")
    return {
        "name": str(data.get("name") or ""),
        "description": str(data.get("description") or ""),
        "members": [dict(m, name=str(m.get("name") or ""), image=str(m.get("image") or "")) for m in members],
        "networks": [dict(n, name=str(n.get("name") or ""), cidr=str(n.get("cidr") or "")) for n in networks],
    }


def _known(mapping, allowed, what):
    unknown = sorted(set(map(str, mapping)) - allowed)
    if unknown:
        raise CommandError(f"{what}: unknown field {unknown[0]} (known: {', '.join(sorted(allowed))})")


def _lines(exc):
    if hasattr(exc, "error_dict"):
        return [f"{field}: {message}" for field, messages in exc.message_dict.items() for message in messages]
    return exc.messages
