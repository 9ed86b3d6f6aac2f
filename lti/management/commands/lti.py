"""``manage.py lti …``: LMS platforms and the tool's keys, through the same services.

lti add NAME --issuer URL --client-id ID --deployment ID [--deployment ID …]
        --keyset-url URL --auth-url URL --token-url URL [--audience AUD]
lti list [--json]
lti remove (ID | --issuer URL --client-id ID)
lti keys [--json]                   (public facts: kid, active, created)
lti rotate-keys [--retire-after-days N]
lti sync-roster GROUP_ID            (the course group's members follow the LMS roster)
lti urls BASE_URL                   (what to give the LMS: login, launch and JWKS URLs)
"""

import json

from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from lti_tool.models import LtiRegistration

from core.changelog import Actor
from core.errors import Conflict
from lti import services
from lti.api.serializers import PlatformSerializer

CLI = Actor(name="cli")


class Command(BaseCommand):
    help = "Register LMS platforms (LTI 1.3), rotate the tool's keys, sync a course's roster."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="verb", required=True)
        add = sub.add_parser("add")
        add.add_argument("name")
        add.add_argument("--issuer", required=True)
        add.add_argument("--client-id", required=True)
        add.add_argument("--deployment", action="append", required=True, dest="deployment_ids")
        add.add_argument("--keyset-url", required=True)
        add.add_argument("--auth-url", required=True)
        add.add_argument("--token-url", required=True)
        add.add_argument("--audience", default="")
        sub.add_parser("list").add_argument("--json", action="store_true")
        remove = sub.add_parser("remove")
        remove.add_argument("id", type=int, nargs="?")
        remove.add_argument("--issuer")
        remove.add_argument("--client-id")
        sub.add_parser("keys").add_argument("--json", action="store_true")
        sub.add_parser("rotate-keys").add_argument("--retire-after-days", type=int)
        sub.add_parser("sync-roster").add_argument("group_id", type=int)
        sub.add_parser("urls").add_argument("base_url")

    def handle(self, *args, verb, **options):
        try:
            getattr(self, "do_" + verb.replace("-", "_"))(**options)
        except ValidationError as exc:
            lines = [f"{field}: {m}" for field, msgs in exc.message_dict.items() for m in msgs]
            raise CommandError("refused: " + "; ".join(lines)) from None
        except Conflict as exc:
            raise CommandError(str(exc)) from None

    def do_add(self, name, issuer, client_id, deployment_ids, keyset_url, auth_url, token_url, audience, **_):
        registration = services.add_platform(
            actor=CLI,
            name=name,
            issuer=issuer,
            client_id=client_id,
            deployment_ids=deployment_ids,
            keyset_url=keyset_url,
            auth_url=auth_url,
            token_url=token_url,
            audience=audience,
        )
        self.stdout.write(f"platform {registration.pk} {registration.name} registered")

    def do_list(self, json_out=False, **options):
        rows = [PlatformSerializer(r).data for r in LtiRegistration.objects.order_by("name", "pk")]
        if options.get("json"):
            self.stdout.write(json.dumps(rows, indent=2, default=str))
            return
        for row in rows:
            state = "" if row["is_active"] else " (inactive)"
            self.stdout.write(
                f"{row['id']}\t{row['name']}\t{row['issuer']}\tclient {row['client_id']}\t"
                f"deployments {','.join(row['deployment_ids'])}{state}"
            )

    def do_remove(self, id=None, issuer=None, client_id=None, **_):
        by = {"pk": id} if id else {"issuer": issuer, "client_id": client_id}
        found = LtiRegistration.objects.filter(**by)
        registration = found.first() if (id or (issuer and client_id)) else None
        if registration is None:
            raise CommandError("no such platform (give its id, or --issuer and --client-id)")
        services.remove_platform(registration, actor=CLI)
        self.stdout.write(f"platform {registration.name} removed")

    def do_keys(self, **options):
        rows = services.key_rows()
        if options.get("json"):
            self.stdout.write(json.dumps(rows, indent=2, default=str))
            return
        for row in rows:
            state = "active" if row["is_active"] else "retired"
            self.stdout.write(f"{row['kid']}\t{state}\t{row['created']:%Y-%m-%d %H:%M}")

    def do_rotate_keys(self, retire_after_days=None, **_):
        kid, retired = services.rotate_keys(actor=CLI, retire_after_days=retire_after_days)
        self.stdout.write(f"new key {kid}; retired {len(retired)}: {' '.join(retired) or '-'}")

    def do_sync_roster(self, group_id, **_):
        course = services.course_of(Group.objects.filter(pk=group_id).first())
        if course is None:
            raise CommandError(f"group {group_id} is no LMS course")
        result = services.sync_roster(course, actor=CLI)
        self.stdout.write(
            f"added {' '.join(result['added']) or '-'}; removed {' '.join(result['removed']) or '-'}; "
            f"skipped (disabled or administrators' accounts) {' '.join(result['skipped']) or '-'}"
        )

    def do_urls(self, base_url, **_):
        base = base_url.rstrip("/")
        urls = (("login (OIDC initiation)", "login"), ("launch (redirect/target link)", "launch"), ("JWKS", "jwks"))
        for label, path in urls:
            self.stdout.write(f"{label}: {base}/lti/{path}/")
