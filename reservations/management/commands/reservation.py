"""``manage.py reservation …``: reservations from the command line, through the same services.

reservation list [--user NAME] [--status S] [--json]
reservation info ID [--json]
reservation create IMAGE --user NAME (--duration MINUTES | --end TIME) [--start TIME] [--ssh-key FILE]
                   [--gpus N] [--gpu-model MODEL]
reservation check IMAGE (--duration MINUTES | --end TIME) [--start TIME] [--gpus N] [--gpu-model MODEL]
reservation extend ID --end TIME
reservation end ID
reservation cancel ID
reservation suspend ID      (an environment's head: every machine, as one; likewise resume and revert)
reservation resume ID
reservation revert ID
reservation tick            (start what is due, end what is over; the workers do this on their own)
TIME is ISO 8601 ("2026-12-01 14:00"; UTC unless it carries an offset). Without --gpus and
--gpu-model, the image's default GPUs are asked for; --gpu-model "" asks for any model.
"""

import json
from datetime import UTC, timedelta

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from core.changelog import Actor
from core.errors import Conflict
from provisioning.models import Image
from reservations import services
from reservations.api.serializers import ReservationSerializer
from reservations.models import Reservation

CLI = Actor(name="cli")


def when(text):
    moment = parse_datetime(text.strip().replace(" ", "T", 1))
    if moment is None:
        raise CommandError(f"{text!r}: not a date and time (ISO 8601, e.g. 2026-12-01 14:00)")
    return moment if timezone.is_aware(moment) else timezone.make_aware(moment, UTC)


class Command(BaseCommand):
    help = "List, create, check, extend, end and cancel reservations; suspend, resume and revert environments."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="verb", required=True)
        listing = sub.add_parser("list")
        listing.add_argument("--user")
        listing.add_argument("--status", choices=Reservation.Status.values)
        listing.add_argument("--json", action="store_true")
        info = sub.add_parser("info")
        info.add_argument("id", type=int)
        info.add_argument("--json", action="store_true")
        for verb in ("create", "check"):
            p = sub.add_parser(verb)
            p.add_argument("image", help="image name")
            p.add_argument("--start", type=when, help="default: now")
            p.add_argument("--end", type=when)
            p.add_argument("--duration", type=int, help="minutes")
            p.add_argument("--gpus", type=int, help="GPUs of one model (default: the image's)")
            p.add_argument("--gpu-model", help='e.g. nvidia-a100-pcie-40gb; "": any model (default: the image\'s)')
            if verb == "create":
                p.add_argument("--user", required=True)
                p.add_argument("--ssh-key", help="a file with the public key to log in with")
        extend = sub.add_parser("extend")
        extend.add_argument("id", type=int)
        extend.add_argument("--end", type=when, required=True)
        for verb in ("end", "cancel", "suspend", "resume", "revert"):
            sub.add_parser(verb).add_argument("id", type=int)
        sub.add_parser("tick")

    def handle(self, *args, verb, **options):
        try:
            getattr(self, f"do_{verb}")(**options)
        except ValidationError as exc:
            lines = [f"{field}: {m}" for field, msgs in exc.message_dict.items() for m in msgs]
            raise CommandError("refused: " + "; ".join(lines)) from None
        except Conflict as exc:
            raise CommandError(str(exc)) from None

    def _get(self, pk):
        try:
            return Reservation.objects.select_related("user", "image", "vm").get(pk=pk)
        except Reservation.DoesNotExist:
            raise CommandError(f"reservation {pk} does not exist") from None

    def _image(self, name):
        try:
            return Image.objects.get(name=name)
        except Image.DoesNotExist:
            raise CommandError(f"image {name!r} does not exist") from None

    def _window(self, options):
        start = options["start"] or timezone.now()
        if (options["end"] is None) == (options["duration"] is None):
            raise CommandError("give --end or --duration")
        return start, options["end"] or start + timedelta(minutes=options["duration"])

    def do_list(self, user=None, status=None, json=False, **_):
        rows = Reservation.objects.select_related("user", "image").order_by("-start", "-id")
        if user:
            rows = rows.filter(user__username=user)
        if status:
            rows = rows.filter(status=status)
        if json:
            return self._json(ReservationSerializer(rows, many=True).data)
        for r in rows:
            owner = r.user.username if r.user else "(free seat)"
            self.stdout.write(
                f"{r.pk:>6}  {r.status:<12} {owner:<16} {r.image.name:<24} "
                f"{r.start:%Y-%m-%d %H:%M} → {r.end:%Y-%m-%d %H:%M}"
            )

    def do_info(self, id, json=False, **_):
        data = ReservationSerializer(self._get(id)).data
        if json:
            return self._json(data)
        for key in ("id", "user", "image_name", "status", "start", "end", "vm", "vm_state", "error"):
            self.stdout.write(f"{key:>10}: {data[key]}")
        for entry in data["history"]:
            self.stdout.write(f"  {entry['at']}  {entry['status']:<12} {entry['reason']}")

    def do_create(self, image, user, ssh_key=None, gpus=None, gpu_model=None, **options):
        try:
            owner = get_user_model().objects.get(username=user)
        except get_user_model().DoesNotExist:
            raise CommandError(f"user {user!r} does not exist") from None
        start, end = self._window(options)
        key = ""
        if ssh_key:
            try:
                with open(ssh_key) as file:
                    key = file.read(8192)
            except OSError as exc:
                raise CommandError(f"--ssh-key {ssh_key}: {exc.strerror}") from None
        reservation = services.reserve(
            owner, self._image(image), actor=CLI, start=start, end=end, ssh_key=key, gpus=gpus, gpu_model=gpu_model
        )
        self.stdout.write(f"reservation {reservation.pk}: {reservation.status}")

    def do_check(self, image, gpus=None, gpu_model=None, **options):
        start, end = self._window(options)
        self.stdout.write(services.check_fit(self._image(image), start, end, gpus, gpu_model).message)

    def do_extend(self, id, end, **_):
        reservation = services.extend(self._get(id), end, actor=CLI)
        self.stdout.write(f"reservation {reservation.pk} now ends {reservation.end:%Y-%m-%d %H:%M} UTC")

    def do_end(self, id, **_):
        job = services.end(self._get(id), "ended from the command line", actor=CLI)
        self.stdout.write(f"reservation {id}: ending" + (f" (job {job.pk})" if job else ""))

    def do_cancel(self, id, **_):
        services.cancel(self._get(id), "canceled from the command line", actor=CLI)
        self.stdout.write(f"reservation {id}: canceled")

    def do_suspend(self, id, **_):
        self._whole(id, services.suspend, "suspended", "suspending")

    def do_resume(self, id, **_):
        self._whole(id, services.resume, "resumed", "resuming")

    def do_revert(self, id, **_):
        self._whole(id, services.revert, "reverted", "reverting")

    def _whole(self, id, verb, done, doing):
        job = verb(self._get(id), f"{done} from the command line", actor=CLI)
        self.stdout.write(f"reservation {id}: {doing} every machine (job {job.pk})")

    def do_tick(self, **_):
        self.stdout.write(json.dumps(services.tick()))

    def _json(self, data):
        self.stdout.write(json.dumps(data, indent=2, default=str))
