"""``manage.py class …``: classes with a term from the command line, through the same services.

class list [--course NAME] [--json]
class info ID [--json]
class create COURSE NAME --image IMAGE --first DAY --last DAY --session "Mon 10:00 90" [--session …]
             [--no-session "2027-04-05 Easter Monday" …] [--zone ZONE] [--seats N] [--lead MINUTES]
             [--vcpus N] [--memory-mib N] [--gpus N] [--hours-budget HOURS]
class change ID [the same options; --session / --no-session replace the class's]
class delete ID
class budget ID [--json]      (each student's hours outside sessions: used, budget, extra, left)
class grant ID STUDENT HOURS --reason WHY   (extra hours of the class's budget; negative: taken back)
class plan             (claim the sessions coming into the look-ahead, build those due; the workers do this)
DAY is a date (2027-03-01); a session's time is local to the class's zone (default: TIME_ZONE).
"""

import json
from datetime import date
from decimal import Decimal, InvalidOperation

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from classes import budget, calendar, services
from classes.api.serializers import ClassSerializer, StandingSerializer
from classes.models import Class
from core.changelog import Actor
from provisioning.models import Image

CLI = Actor(name="cli")


def day(text):
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise CommandError(f"{text!r}: not a date (2027-03-01)") from None


class Command(BaseCommand):
    help = "Classes with a term: list, info, create, change, delete, plan, budget, grant."

    def add_arguments(self, parser):
        verbs = parser.add_subparsers(dest="verb", required=True)
        listing = verbs.add_parser("list")
        listing.add_argument("--course")
        listing.add_argument("--json", action="store_true")
        info = verbs.add_parser("info")
        info.add_argument("id", type=int)
        info.add_argument("--json", action="store_true")
        create = verbs.add_parser("create")
        create.add_argument("course")
        create.add_argument("name")
        create.add_argument("--image", required=True)
        create.add_argument("--first", type=day, required=True)
        create.add_argument("--last", type=day, required=True)
        change = verbs.add_parser("change")
        change.add_argument("id", type=int)
        change.add_argument("--name")
        change.add_argument("--image")
        change.add_argument("--first", type=day)
        change.add_argument("--last", type=day)
        for verb in (create, change):
            verb.add_argument("--session", action="append", help='"Mon 10:00 90" (weekday, local start, minutes)')
            verb.add_argument("--no-session", action="append", help='"2027-04-05 Easter Monday"')
            verb.add_argument("--zone")
            verb.add_argument("--seats", type=int)
            verb.add_argument("--lead", type=int)
            verb.add_argument("--vcpus", type=int)
            verb.add_argument("--memory-mib", type=int)
            verb.add_argument("--gpus", type=int)
            verb.add_argument("--hours-budget", type=hours, help="each student's hours outside sessions (blank: none)")
        delete = verbs.add_parser("delete")
        delete.add_argument("id", type=int)
        verbs.add_parser("plan")
        shown = verbs.add_parser("budget")
        shown.add_argument("id", type=int)
        shown.add_argument("--json", action="store_true")
        grant = verbs.add_parser("grant")
        grant.add_argument("id", type=int)
        grant.add_argument("student")
        grant.add_argument("hours", type=hours)
        grant.add_argument("--reason", required=True)

    def handle(self, *args, verb, **options):
        try:
            getattr(self, f"do_{verb}")(options)
        except ValidationError as exc:
            raise CommandError(_words(exc)) from None

    def do_list(self, options):
        found = Class.objects.select_related("course", "image").order_by("pk")
        if options["course"]:
            found = found.filter(course__name=options["course"])
        if options["json"]:
            self.stdout.write(json.dumps(ClassSerializer(found, many=True).data, indent=2, default=str))
            return
        for klass in found:
            self.stdout.write(
                f"{klass.pk}\t{klass.course.name}\t{klass.name}\t{klass.image.name}\t"
                f"{klass.first_day}..{klass.last_day}\t{klass.time_zone}"
            )

    def do_info(self, options):
        klass = _class(options["id"])
        data = ClassSerializer(klass).data
        if options["json"]:
            self.stdout.write(json.dumps(data, indent=2, default=str))
            return
        self.stdout.write(f"{klass.name} ({klass.course.name}), {klass.image.name}, {klass.time_zone}")
        self.stdout.write(f"term {klass.first_day} to {klass.last_day}")
        for s in klass.sessions.all():
            self.stdout.write(f"  every {calendar.WEEKDAYS[s.weekday]} {s.start:%H:%M}, {s.minutes} min")
        for e in klass.exceptions.all():
            self.stdout.write(f"  no session on {e.day} {e.reason}")
        for o, meeting in services.upcoming(klass):
            state = f"block {meeting.block_id}" if meeting else "not reserved yet"
            self.stdout.write(f"  next: {o.label(klass.time_zone)} ({state})")
        if klass.problem:
            self.stdout.write(f"problem: {klass.problem}")

    def do_create(self, options):
        course = Group.objects.filter(name=options["course"]).first()
        if course is None:
            raise CommandError(f"no course {options['course']!r}")
        values = self._values(options)
        if "sessions" not in values:
            raise CommandError("give at least one --session")
        term = {"first_day": options["first"], "last_day": options["last"]}
        klass = services.create_class(actor=CLI, course=course, name=options["name"], **term, **values)
        self.stdout.write(f"class {klass.pk}: {klass.meetings.count()} sessions reserved")

    def do_change(self, options):
        klass = _class(options["id"])
        values = self._values(options)
        for option, field in (("name", "name"), ("first", "first_day"), ("last", "last_day")):
            if options[option] is not None:
                values[field] = options[option]
        services.change_class(klass, actor=CLI, **values)
        self.stdout.write(f"class {klass.pk} changed: {klass.meetings.count()} sessions reserved")

    def do_delete(self, options):
        dropped = services.delete_class(_class(options["id"]), actor=CLI)
        self.stdout.write(f"deleted; {dropped} sessions to come canceled")

    def do_plan(self, options):
        self.stdout.write(json.dumps(services.plan_round(actor=CLI)))

    def do_budget(self, options):
        klass = _class(options["id"])
        students = list(budget.students(klass))
        rows = [StandingSerializer.of(u, s) for u, s in zip(students, budget.roster(klass, students), strict=True)]
        if options["json"]:
            self.stdout.write(json.dumps(StandingSerializer(rows, many=True).data, indent=2))
            return
        for row in rows:
            left = "no limit" if row["left"] is None else f"{budget.hours(row['left'])} left"
            used, extra = budget.hours(row["used"]), budget.hours(row["extra"])
            self.stdout.write(f"{row['student']}\t{used} h used\t{extra} h extra\t{left}")

    def do_grant(self, options):
        klass = _class(options["id"])
        student = get_user_model().objects.filter(username=options["student"]).first()
        if student is None:
            raise CommandError(f"no user {options['student']!r}")
        budget.grant_hours(klass, student, options["hours"], options["reason"], actor=CLI)
        now = budget.standing(student, klass)
        self.stdout.write(f"granted {budget.plural(options['hours'])} to {student.get_username()}: {now.note()}")

    def _values(self, options):
        values = {}
        if options["image"]:
            values["image"] = Image.objects.filter(name=options["image"]).first()
            if values["image"] is None:
                raise CommandError(f"no image {options['image']!r}")
        try:
            if options["session"]:
                values["sessions"] = calendar.parse_sessions("\n".join(options["session"]))
            if options["no_session"]:
                values["exceptions"] = calendar.parse_exceptions("\n".join(options["no_session"]))
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        names = {"zone": "time_zone", "seats": "seats", "lead": "lead_minutes", "vcpus": "vcpus"}
        names.update({"memory_mib": "memory_mib", "gpus": "gpus", "hours_budget": "hours_budget"})
        values.update({field: options[option] for option, field in names.items() if options[option] is not None})
        return values


def hours(text):
    try:
        return Decimal(text)
    except InvalidOperation:
        raise CommandError(f"{text!r}: not a number of hours (2, 1.5)") from None


def _class(pk):
    klass = Class.objects.select_related("course", "image").filter(pk=pk).first()
    if klass is None:
        raise CommandError(f"no class {pk}")
    return klass


def _words(exc):
    if hasattr(exc, "error_dict"):
        return "; ".join(f"{field}: {' '.join(messages)}" for field, messages in exc.message_dict.items())
    return " ".join(exc.messages)
