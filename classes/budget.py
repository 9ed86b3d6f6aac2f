"""The hours budget of a class: how long each student may use its image outside its sessions.

Contract:

- ``Class.hours_budget`` binds each *student* of the class's course (a member who does not
  teach it; administrators never) for the class's image during its term: from local midnight of
  its first day to local midnight after its last, in the class's zone. Blank: no limit; 0: no
  hours outside the sessions. Extra hours an instructor granted a student (``BudgetGrant``,
  ``grant_hours``) add to it; a negative grant takes hours back, never below none extra.
- What counts: the student's reservations of the image starting within the term, except a
  block's seats (a class session is the instructor's allotment, not the student's budget) and
  templates; a seat extended past its session counts the hours after its session's end.
- How long each counts: from when its machine was ready (``max(start, first ready)``; not ready
  yet: its start) to when it stopped (its first ending/ended/failed/canceled), or to its booked
  end while it has not stopped. So a request counts its whole duration, one that ends early
  gives the rest back, and one never ready counts nothing.
- A student of several classes with the same image: a reservation is charged to one class, the
  one whose term contains its start; of several, the one whose term started last (then the
  lowest id). Only that class's budget binds it, and only its hours show as used there.
- Checked beside the quotas, under their locks: ``check`` fills ``reservations.reserving.BUDGETS``
  and is called after ``quotas.check_locked`` (which locks the user's row first; SQLite's write
  transaction serialises every writer) in the transaction that writes the reservation, so a
  student's parallel requests are counted one after the other and never pass the budget together.
"""

from dataclasses import dataclass
from datetime import time, timedelta
from decimal import ROUND_DOWN, Decimal, InvalidOperation

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Sum

from accounts import access
from classes import calendar
from classes.models import BudgetGrant, Class
from classes.services import course_teachers, teaches
from core import changelog
from core.changelog import Actor
from reservations import usage
from reservations.models import Reservation
from reservations.reserving import Budget

MAX_GRANT = Decimal(1000)


@dataclass(frozen=True)
class Standing:
    """Where one student's budget of one class stands, in hours (``budget`` None: no limit)."""

    klass: Class
    budget: Decimal | None
    extra: Decimal
    used_seconds: float

    @property
    def allowed(self):
        return None if self.budget is None else self.budget + max(self.extra, Decimal(0))

    @property
    def used(self):
        return Decimal(self.used_seconds / 3600).quantize(Decimal("0.01"))

    @property
    def left_seconds(self):
        return None if self.allowed is None else max(0.0, float(self.allowed) * 3600 - self.used_seconds)

    @property
    def left(self):
        # Rounded down: the hours shown are never more than a request may take.
        left = self.left_seconds
        return None if left is None else Decimal(left / 3600).quantize(Decimal("0.01"), rounding=ROUND_DOWN)

    def note(self):
        if self.allowed is None:
            return f"{plural(self.used)} used for {self.klass.name} (no limit)"
        return f"{plural(self.left)} left of your {hours(self.allowed)}-hour budget for {self.klass.name}"


def plural(value):
    text = hours(value)
    return f"{text} hour" + ("" if text == "1" else "s")


def hours(value):
    """``Decimal("3.50")`` -> ``"3.5"``, ``Decimal("20.00")`` -> ``"20"``."""
    text = f"{Decimal(value):.2f}".rstrip("0").rstrip(".")
    return text if text != "-0" else "0"


# --- which class, which reservations --------------------------------------------------------


def term(klass):
    """The class's term as aware UTC datetimes ``[first day 00:00, day after the last 00:00)``."""
    zone = calendar.zone_of(klass.time_zone)
    first = calendar.at_local(klass.first_day, time(), zone)
    return first, calendar.at_local(klass.last_day + timedelta(days=1), time(), zone)


def studied(user, image=None):
    """The classes ``user`` is a student of (of ``image``): their courses' that they do not teach.
    (Who teaches is asked only of the courses with such a class: for most reservations, none,
    and this is read in every one's locked transaction.)"""
    if user is None or access.is_admin(user):
        return Class.objects.none()
    found = Class.objects.filter(course__in=access.own_groups(user))
    found = found.filter(image=image) if image is not None else found
    courses = set(found.values_list("course_id", flat=True))
    if not courses:
        return Class.objects.none()  # (read no more)
    taught = [g for g, ids in course_teachers(courses, [user.pk]).items() if user.pk in ids]
    return found.exclude(course__in=taught)


def charged(classes, at):
    """The one of ``classes`` a reservation starting at ``at`` is charged to (None: none)."""
    holding = [k for k in classes if term(k)[0] <= at < term(k)[1]]
    return min(holding, key=lambda k: (-term(k)[0].timestamp(), k.pk), default=None)


def _rows(klass, user_ids):
    """The reservations of ``klass``'s image by ``user_ids`` starting in its term, with the
    moments their use is counted from and to (an environment: its head, whose image is its
    entry machine's)."""
    first, last = term(klass)
    found = Reservation.objects.filter(
        user_id__in=user_ids, image_id=klass.image_id, start__gte=first, start__lt=last, template_of__isnull=True
    ).filter(head__isnull=True)  # an environment's hours once, by its entry machine's image
    found = usage.with_use_span(found)
    fields = ("pk", "user_id", "start", "end", "status", "ready_at", "stop_at", "block__start", "block__end")
    return [dict(zip(fields, row, strict=True)) for row in found.order_by().values_list(*fields)]


def _seconds(row, end=None):
    """The seconds one reservation counts (``end``: its end as asked, for an extension)."""
    end = end or row["end"]
    if row["ready_at"] is None and (row["stop_at"] is not None or row["status"] not in Reservation.ACTIVE):
        return 0.0  # over (or refused) before a machine was ever ready: nothing was used
    if row["stop_at"] is not None:
        end = min(end, row["stop_at"])
    since = max(row["start"], row["ready_at"] or row["start"])
    if row["block__end"] is not None:  # a seat: only what runs past its session counts
        # Each week of a block is at the local hour (``core.localtime.weekly``): its session is
        # the seat's start and the block's length, never a whole number of UTC weeks later.
        since = max(since, row["start"] + (row["block__end"] - row["block__start"]))
    return max(0.0, (end - since).total_seconds())


def _others(klass, user_ids):
    """``{user id: [other classes of the same image they are a student of]}`` (for ``charged``):
    only those whose term can hold a start in ``klass``'s (its dates give or take a day each
    way, for the zones; ``charged`` compares the instants), their membership and teachers read
    at once whatever their number, as this runs in every reservation's locked transaction."""
    others = {pk: [] for pk in user_ids}
    slack = timedelta(days=2)
    near = Class.objects.filter(image_id=klass.image_id).exclude(pk=klass.pk)
    near = list(near.filter(first_day__lte=klass.last_day + slack, last_day__gte=klass.first_day - slack))
    if not near or not user_ids:
        return others
    courses = {k.course_id for k in near}
    through = get_user_model().groups.through.objects
    members = set(through.filter(user_id__in=user_ids, group_id__in=courses).values_list("user_id", "group_id"))
    teachers = course_teachers(courses, {user for user, _ in members})
    for other in near:
        for pk in user_ids:
            if (pk, other.course_id) in members and pk not in teachers[other.course_id]:
                others[pk].append(other)
    return others


def used_seconds(klass, user_ids, *, exclude=None, end=None):
    """``{user id: seconds}`` of ``klass``'s budget used; ``exclude``: a reservation's id counted
    with ``end`` as its end instead of its own (an extension asked for)."""
    others = _others(klass, user_ids)
    used = dict.fromkeys(user_ids, 0.0)
    for row in _rows(klass, user_ids):
        if others[row["user_id"]] and charged([klass, *others[row["user_id"]]], row["start"]) != klass:
            continue
        used[row["user_id"]] += _seconds(row, end if row["pk"] == exclude else None)
    return used


def extra_hours(klass, user_ids):
    rows = BudgetGrant.objects.filter(klass=klass, student_id__in=user_ids).values("student_id")
    found = {r["student_id"]: r["total"] for r in rows.annotate(total=Sum("hours")).order_by()}
    return {pk: found.get(pk) or Decimal(0) for pk in user_ids}


def standing(user, klass):
    return roster(klass, [user])[0]


def roster(klass, users):
    """``Standing`` of each of ``users`` (students of the class) in ``klass``."""
    ids = [u.pk for u in users]
    used, extra = used_seconds(klass, ids), extra_hours(klass, ids)
    return [Standing(klass, klass.hours_budget, extra[pk], used[pk]) for pk in ids]


def standings(class_id, user_ids):
    """``reservations.showback.STUDENT_BUDGETS``: ``{user id: {"budget", "extra", "used",
    "left"}}`` (hours) of those of ``user_ids`` the class's budget binds, over its whole term
    as of now; {} when the class has no budget."""
    klass = Class.objects.filter(pk=class_id, hours_budget__isnull=False).first()
    if klass is None:
        return {}
    users = list(students(klass).filter(pk__in=user_ids))
    return {
        user.pk: {"budget": float(s.budget), "extra": float(s.extra), "used": float(s.used), "left": float(s.left)}
        for user, s in zip(users, roster(klass, users), strict=True)
    }


def students(klass):
    """The course's active members who do not teach it (by the per-course rule,
    ``services.course_teachers``), by user name."""
    members = klass.course.user_set.filter(is_active=True)
    teachers = course_teachers([klass.course_id], members.values_list("pk", flat=True))[klass.course_id]
    return members.exclude(pk__in=teachers).order_by("username")


# --- the hook: one request against the budget -----------------------------------------------


def check(user, image, start, end, *, exclude=None):
    """``reservations.reserving.BUDGETS``: the budget that binds ``user``'s reservation of
    ``image`` starting at ``start`` (None: none binds), refused if ``[start, end)`` passes it.
    Called under the quota locks (see the module docstring)."""
    klass = charged(list(studied(user, image).select_related("course")), start)
    if klass is None:
        return None
    current = standing(user, klass)
    if exclude is not None:  # an extension: what that reservation would count with its new end, more
        after = used_seconds(klass, [user.pk], exclude=exclude[1], end=end)[user.pk]
        return _answer(current, max(0.0, after - current.used_seconds))
    return _answer(current, 0.0 if end is None else max(0.0, (end - start).total_seconds()))


def _answer(current, asked):
    if current.allowed is None or asked <= current.left_seconds:
        return Budget(current.note())
    refusal = f"{current.note()}; this asks for {plural(Decimal(asked / 3600).quantize(Decimal('0.01')))}"
    return Budget(current.note(), refusal)


# --- the verb ----------------------------------------------------------------------------------


def grant_hours(klass, student, hours_given, reason, *, actor, by=None):
    """Give ``student`` extra hours of ``klass``'s budget (negative: take some back, never below
    none extra). ``by``: the user it is done for, who must teach the course (None: the system,
    e.g. the CLI). Returns the ``BudgetGrant``."""
    actor = Actor.of(actor)
    if by is not None and not teaches(by, klass.course):
        raise PermissionDenied(f"you do not teach {klass.course.name}")
    amount = _amount(hours_given)
    errors = {}
    if student is None or not students(klass).filter(pk=student.pk).exists():
        errors["student"] = [f"no student of {klass.course.name} (a member who does not teach it)"]
    if not str(reason or "").strip():
        errors["reason"] = ["say why (it is kept with the grant)"]
    elif len(reason.strip()) > 200:
        errors["reason"] = ["at most 200 characters"]
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        Class.objects.select_for_update().filter(pk=klass.pk).values_list("pk").first()  # grants one at a time
        total = extra_hours(klass, [student.pk])[student.pk] + amount
        if total < 0:
            raise ValidationError({"hours": [f"{student.get_username()} has {hours(total - amount)} extra hours"]})
        grant = BudgetGrant.objects.create(
            klass=klass, student=student, hours=amount, reason=reason.strip(), granted_by=by
        )
        changelog.record(
            grant,
            "create",
            actor,
            changes={"hours": str(amount), "student": student.get_username(), "class": klass.name},
            reason=reason.strip(),
        )
    return grant


def _amount(value):
    try:
        amount = Decimal(str(value)).quantize(Decimal("0.01"))
    except (InvalidOperation, ValueError, TypeError):
        raise ValidationError({"hours": ["a number of hours, such as 2 or 1.5"]}) from None
    if not amount or not -MAX_GRANT <= amount <= MAX_GRANT:
        raise ValidationError({"hours": [f"between -{MAX_GRANT} and {MAX_GRANT} hours, not 0"]})
    return amount
