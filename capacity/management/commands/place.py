"""``manage.py place``: where would a VM go? A placement dry run, with the reasons."""

import json
from datetime import datetime, timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from capacity import loaders, services
from capacity.api.views import plan_payload
from capacity.durations import parse_duration, parse_moment


def _names(text):
    return frozenset(t.strip() for t in (text or "").split(",") if t.strip())


class Command(BaseCommand):
    help = "Show where a VM of this size would be placed (nothing is claimed), or why not and from when."

    def add_arguments(self, parser):
        parser.add_argument("--vcpus", type=float, required=True)
        parser.add_argument("--memory", type=float, required=True, help="MiB")
        parser.add_argument("--disk", type=float, default=0, help="GiB")
        parser.add_argument("--image", help="image name: restricts hosts to the hypervisor types it has variants for")
        parser.add_argument("--formats", help="image formats available, comma-separated (qcow2,vmdk,…)")
        parser.add_argument("--start", default="now", help="'now' or '2026-12-01 14:00' (UTC)")
        parser.add_argument("--duration", help="e.g. 2h, 90m (default: open-ended)")
        parser.add_argument("--tags", help="required host tags, comma-separated")
        parser.add_argument("--not-tags", help="forbidden host tags, comma-separated")
        parser.add_argument("--anti-affinity", default="")
        parser.add_argument("--policy", choices=["balanced", "pack", "external"])
        parser.add_argument("--json", action="store_true")
        parser.add_argument("--save", metavar="FILE", help="write the decision's input (for replay) to FILE")

    def handle(self, *args, **opts):
        if opts["vcpus"] <= 0 or opts["memory"] <= 0 or opts["disk"] < 0:
            raise CommandError("--vcpus and --memory must be positive, --disk not negative")
        try:
            start = parse_moment(opts["start"])
            duration = parse_duration(opts["duration"]) if opts["duration"] else None
        except ValueError as error:
            raise CommandError(str(error)) from None
        if start < timezone.now() - PAST_SLACK:
            raise CommandError(f"--start {opts['start']} is in the past; placement plans from now on")
        types = loaders.hypervisor_types_for(_names(opts["formats"]) or None)
        if opts["image"]:
            types = image_types(opts["image"])
        demand = services.Demand(
            vcpus=opts["vcpus"],
            memory_mib=opts["memory"],
            disk_gib=opts["disk"],
            start=start,
            end=start + duration if duration else None,
            hypervisors=types,
            image=opts["image"] or "",
            required_tags=_names(opts["tags"]),
            forbidden_tags=_names(opts["not_tags"]),
            anti_affinity=opts["anti_affinity"],
            policy=opts["policy"],
        )
        try:
            result = services.plan(demand, save_to=opts["save"])
        except OSError as error:
            raise CommandError(f"--save: {error}") from None
        if opts["json"]:
            self.stdout.write(json.dumps(plan_payload(result, staff=True), default=_json_value, indent=2))
        else:
            self.stdout.write(str(result))
            for miss in result.closest_misses:
                short = ", ".join(f"{v:g} {k}" for k, v in miss.shortfall.as_dict().items() if v)
                self.stdout.write(f"  closest: {miss.host}, short of {short}")
        if not result.ok:
            raise SystemExit(1)


#: A start this little in the past still means "now" (typing takes time).
PAST_SLACK = timedelta(minutes=1)


def _json_value(value):
    return value.isoformat() if isinstance(value, datetime) else str(value)


def image_types(name):
    try:
        return services.image_types(name)
    except LookupError as error:
        raise CommandError(str(error)) from None
