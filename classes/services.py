"""Courses and their classes with a term: who may see and run them, and every write.

A course is a group that is not a role group (its members are the students, its instructors
the members holding the instructor role). A ``Class`` is one of its weekly sessions of an image
over a term, in a time zone, with dates it does not meet.

Each session occurrence is made real as one ``reservations.BlockAllocation`` of one week, its
seats reservations made by ``reservations.reserving.create`` (``_claim``): a second seat system
would need its own claims, quotas, builds, ends, idle reclamation, pre-staging, usage and pages,
and would drift from the block's. Through the block path every seat is claimed under the same
locks as every other reservation (the image's licence cap under ``quotas.check_locked``, the
capacity by ``capacity.claim``, placed for the occurrence's own window), all seats of an
occurrence or none; the reservations clock ends them at the session's end, idle reclamation
and pre-staging see them as any block's seats (the block's group is the course), and members
take a free seat with ``blocks.take_seat``. Seats go to the course's members (by user name) when
the occurrence is claimed, the rest are free. Their VMs are built from the image's production
revision at build time (the reservation names no revision).

Occurrences are computed by ``classes.calendar`` in the class's zone (the local hour holds
across daylight-saving changes). Those starting within ``CLASS_LOOKAHEAD_DAYS`` are claimed
when the class is made or changed (all of them, or the class is refused naming the occurrence
that does not fit); later ones by ``plan_round`` as they come into the window, one occurrence
at a time (a refusal then is kept in ``Class.problem`` and tried again next round). Idempotent:
a ``Meeting`` is made once per class and start (a unique constraint; the class row is locked).
``plan_round`` also builds the seats of a session ``lead_minutes`` before it starts (the
reservations clock builds any pending one ``RESERVATION_LEAD_MINUTES`` before: the earlier wins).

A class that requires approval, or whose image does, is not made at once when an instructor asks
for it: ``create_class`` returns the ``reservations.approvals`` request it waits in (its values kept),
and ``proceed_approved`` makes it when an approver approves, through ``create_class`` itself.

Changing a class re-plans the occurrences not yet built (their blocks canceled, their claims
released, the window claimed again in the same transaction: a new plan that does not fit
leaves the old one); deleting it cancels every future occurrence (a session under way ends at
its time).
"""

import logging
from datetime import date, time, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from accounts import access, preferences
from classes import calendar
from classes.models import Class, Meeting, NoSessionDay, WeeklySession
from core import changelog
from core.changelog import Actor
from environments import services as environment_services
from environments.models import EnvironmentTemplate
from provisioning import quotas
from provisioning import services as vms
from reservations import approvals, blocks, environments, reserving
from reservations.models import ApprovalRequest, BlockAllocation, Reservation

log = logging.getLogger(__name__)
S = Reservation.Status
PLANNER = Actor(name="class planner")
UNBUILT = (S.REQUESTED, S.PENDING)
MAX_VCPUS = 64


# --- who may see and run what -------------------------------------------------------------------


def courses(user):
    """The course groups ``user`` may open: administrators and auditors every one, others their own."""
    if access.is_admin(user) or access.can(user, "see_all"):
        return Group.objects.exclude(pk__in=access.role_groups())
    return access.own_groups(user)


def course_teachers(group_ids, user_ids):
    """``{group id: the ids of ``user_ids`` who teach it}``, by the per-course rule (an
    administrator teaches every course; membership is not checked here)."""
    group_ids, user_ids = list(group_ids), list(user_ids)
    lms = access.known_teachers(group_ids)  # (LMS courses: the LMS's word; ``access.COURSE_TEACHERS``)
    users = get_user_model().objects.filter(pk__in=user_ids)
    local = set()
    if any(g not in lms for g in group_ids):
        local = set(users.filter(access.holders("teach")).values_list("pk", flat=True))
    admins = set()
    if lms:
        admin = Q(is_active=True) & (Q(is_staff=True) | Q(is_superuser=True))  # access.is_admin's rule
        admins = set(users.filter(admin).values_list("pk", flat=True))
    return {g: (set(lms[g]) & set(user_ids)) | admins if g in lms else local for g in group_ids}


def taught_groups(user):
    """The ids of the courses ``user`` teaches: an administrator every one (not the role
    groups), others those of their own groups they teach by the per-course rule."""
    if user is None or not user.is_authenticated or not user.is_active:
        return set()
    if access.is_admin(user):
        return set(Group.objects.exclude(pk__in=access.role_groups()).values_list("pk", flat=True))
    own = list(access.own_groups(user).values_list("pk", flat=True))
    return {g for g, ids in course_teachers(own, [user.pk]).items() if user.pk in ids}


def teaches(user, group):
    """Whether ``user`` runs ``group``'s course: an administrator, or a member who teaches this
    course (the LMS's role in it for an LMS course, the instructor role for a local one)."""
    if access.is_admin(user):
        return True
    if user is None or not user.is_authenticated or not access.own_groups(user).filter(pk=group.pk).exists():
        return False
    return user.pk in course_teachers([group.pk], [user.pk])[group.pk]


def visible_classes(user):
    """The classes of the courses ``user`` may open."""
    return Class.objects.filter(course__in=courses(user)).select_related("course", "image")


def managed_classes(user):
    """The classes ``user`` may change: administrators any, an instructor those of the courses
    they teach."""
    found = Class.objects.select_related("course", "image")
    if access.is_admin(user):
        return found
    return found.filter(course__in=taught_groups(user))


# --- showback (``reservations.showback``'s hooks) ---------------------------------------------------


def class_of_blocks(block_ids):
    """``{block_id: (class_id, class_name)}`` of the blocks that are a class session's."""
    rows = Meeting.objects.filter(block_id__in=block_ids).values_list("block_id", "klass_id", "klass__name")
    return {block: (klass, name) for block, klass, name in rows}


def taught_classes(user):
    """The ids of the classes whose usage ``user`` sees per student: those they may change."""
    return set(managed_classes(user).values_list("pk", flat=True))


def hours_budgets(class_ids):
    """``{class_id: hours}`` of the classes that have an hours budget (none while classes
    carry no ``hours_budget``: the usage report shows the column only when there are some)."""
    if not any(f.name == "hours_budget" for f in Class._meta.get_fields()):
        return {}
    rows = Class.objects.filter(pk__in=class_ids, hours_budget__isnull=False).values_list("pk", "hours_budget")
    return {pk: float(hours) for pk, hours in rows}


def default_zone(user=None):
    """The zone a new class of ``user``'s is in unless one is given: the instructor's own
    (chosen, else their browser's), else the site's ``TIME_ZONE``."""
    return preferences.zone_name(user) if user is not None and user.is_authenticated else settings.TIME_ZONE


# --- validation ------------------------------------------------------------------------------------


def _errors(values, members):
    """Per-field errors of a class's ``values`` (the model's fields, ``sessions``, ``exceptions``)."""
    errors = {}
    if not values["name"].strip():
        errors["name"] = ["give the class a name"]
    course = values["course"]
    if not isinstance(course, Group) or access.role_groups().filter(pk=course.pk).exists():
        errors["course"] = ["no such course (a group that gives a role is no course)"]
    image = values["image"]
    if not image.active:
        errors["image"] = [f"image {image.name} is inactive"]
    errors.update(_environment_errors(values["environment"], image))
    try:
        calendar.zone_of(values["time_zone"])
    except ValueError as exc:
        errors["time_zone"] = [str(exc)]
    errors.update(calendar.term_errors(values["first_day"], values["last_day"], values["sessions"]))
    today = timezone.now().date()
    if not today - timedelta(days=366) <= values["first_day"] <= today + timedelta(days=2 * 366):
        errors.setdefault("first_day", []).append("a term starts within two years of today")
    if not today <= values["last_day"] <= today + timedelta(days=3 * 366):
        errors.setdefault("last_day", []).append("a term ends after today and within three years")
    seats = values["seats"]
    if seats is not None and not 1 <= seats <= settings.CLASS_MAX_SEATS:
        errors["seats"] = [f"between 1 and {settings.CLASS_MAX_SEATS} seats"]
    if seats is None and members > settings.CLASS_MAX_SEATS:
        errors["seats"] = [f"the course has {members} members; a class has at most {settings.CLASS_MAX_SEATS} seats"]
    budget = values["hours_budget"]
    if budget is not None and not 0 <= budget <= MAX_BUDGET_HOURS:
        errors["hours_budget"] = [f"0 to {MAX_BUDGET_HOURS} hours (blank: no limit)"]
    if not 0 <= values["lead_minutes"] <= 24 * 60:
        errors["lead_minutes"] = ["0 minutes to a day"]
    if values["vcpus"] is not None and not 1 <= values["vcpus"] <= MAX_VCPUS:
        errors["vcpus"] = [f"1 to {MAX_VCPUS} CPUs"]
    memory = values["memory_mib"]
    if memory is not None and memory < image.min_memory_mib:
        errors["memory_mib"] = [f"{image.name} needs at least {image.min_memory_mib} MiB"]
    errors.update(reserving.gpu_errors(values["gpus"], values["gpu_model"]))
    days = [day for day, _ in values["exceptions"]]
    repeated = sorted({str(day) for day in days if days.count(day) > 1})
    if repeated:
        errors["exceptions"] = [f"{', '.join(repeated)} given twice"]
    return errors


def _environment_errors(environment, image):
    if environment is None:
        return {}
    if not environment.active:
        return {"environment": [f"environment {environment.name} is inactive"]}
    if image != environments.entry_image(environment):
        return {"image": [f"a seat of {environment.name} is its entry machine's image, not {image.name}"]}
    return {}


FIELDS = (
    "name",
    "image",
    "time_zone",
    "first_day",
    "last_day",
    "seats",
    "lead_minutes",
    "vcpus",
    "memory_mib",
    "hours_budget",
)
DEFAULTS = {
    "seats": None,
    "lead_minutes": 15,
    "vcpus": None,
    "memory_mib": None,
    "gpus": 0,
    "gpu_model": "",
    "hours_budget": None,
    "requires_approval": False,
    "environment": None,
}
# changeable besides FIELDS (the form's ``initial_of`` aside)
OTHER = ("gpus", "gpu_model", "requires_approval", "environment")
MAX_BUDGET_HOURS = 10000
# Changing these changes no claim: the sessions are re-planned only for the rest. (Nor does
# ``requires_approval``: it gates the making of a class, done by then.)
NOT_PLANNED = ("name", "lead_minutes", "hours_budget", "requires_approval")


def _check(values, user):
    """Refuse ``values`` (``ValidationError``, ``PermissionDenied``) unless ``user`` (None: the
    system) may have such a class."""
    errors = _errors(values, values["course"].user_set.filter(is_active=True).count())
    if errors:
        raise ValidationError(errors)
    if user is not None:
        if not teaches(user, values["course"]) or not courses(user).filter(pk=values["course"].pk).exists():
            log.warning("class for course %s refused to %s: not their course", values["course"].name, user)
            raise PermissionDenied(f"you do not teach {values['course'].name}")
        if not vms.visible_images(user).filter(pk=values["image"].pk).exists():
            raise ValidationError({"image": ["no such image, or you may not use it"]})
        environment = values["environment"]
        usable = environment_services.visible_templates(user)
        if environment is not None and not usable.filter(pk=environment.pk).exists():
            raise ValidationError({"environment": ["no such environment, or you may not use it"]})


# --- the verbs --------------------------------------------------------------------------------------


def create_class(
    *, actor, course, name, image, first_day, last_day, sessions, exceptions=(), by=None, now=None, approved=False,
    **more,
):  # fmt: skip
    """Make a class of ``course`` and claim its sessions within the look-ahead, all or nothing.

    ``sessions``: ``calendar.Session``; ``exceptions``: ``(date, reason)``; ``by``: the user it is
    made for, whose permission is checked (None: the system, e.g. the CLI); ``more``: the other
    fields (``DEFAULTS``, ``time_zone``: ``by``'s default). Returns the class — or, when it
    ``requires_approval`` or its image does (and ``by`` is no administrator, nor the system), the
    ``ApprovalRequest`` it waits in: nothing is made or claimed until an approver approves it
    (``reservations.approvals``; ``approved``: that approval, making it now).
    """
    actor = Actor.of(actor)
    now = now or timezone.now()
    unknown = set(more) - set(DEFAULTS) - {"time_zone"}
    if unknown:
        raise ValidationError({name: ["unknown field"] for name in sorted(unknown)})
    values = {**DEFAULTS, "time_zone": more.pop("time_zone", "") or default_zone(by), **more}
    values.update(course=course, name=name, image=image, first_day=first_day, last_day=last_day)
    values.update(sessions=list(sessions), exceptions=list(exceptions))
    _check(values, by)
    if by is not None and not approved and _needs_approval(by, values):
        return _ask(values, by, now, actor=actor)
    with transaction.atomic():
        klass = Class.objects.create(
            course=course,
            created_by=by,
            name=name.strip(),
            **{k: values[k] for k in (*FIELDS, *OTHER) if k != "name"},
        )
        _write_calendar(klass, values["sessions"], values["exceptions"])
        made = _plan(klass, now, actor=actor, strict=True)
        changelog.record(klass, "create", actor, reason=f"{len(made)} sessions claimed for {course.name}")
    build_due(now, klass=klass, actor=actor)
    return klass


def _needs_approval(by, values):
    """Does ``by``'s class wait for an approver: it requires approval, or the image of any of
    its seats' machines does (an environment's, not only its entry machine's)."""
    if approvals.needs_approval(by, values["image"], values["requires_approval"]):
        return True
    template = values["environment"]
    return template is not None and bool(environments.gated_images(by, environment_services.expand(template)))


def _ask(values, by, now, *, actor):
    """The class's request for approval: what ``create_class`` was given, kept to make it then."""
    sessions = values["sessions"]
    skip = [day for day, _ in values["exceptions"]]
    found = calendar.occurrences(values["first_day"], values["last_day"], sessions, values["time_zone"], skip)
    starts = next((o.start for o in found if o.start > now), None)
    payload = {
        "course": values["course"].pk,
        "name": values["name"].strip(),
        "first_day": values["first_day"].isoformat(),
        "last_day": values["last_day"].isoformat(),
        "sessions": [[s.weekday, s.start.isoformat(), s.minutes] for s in sessions],
        "exceptions": [[day.isoformat(), reason] for day, reason in values["exceptions"]],
        "more": {k: values[k] for k in (*DEFAULTS, "time_zone") if k != "environment"},
        "environment": values["environment"].pk if values["environment"] is not None else None,
    }
    summary = f"the class {payload['name']} of {values['course'].name} ({values['image'].name}, {len(found)} sessions)"
    kind = ApprovalRequest.Kind.CLASS
    return approvals.ask(kind, by, values["image"], payload, summary, actor=actor, starts_at=starts, now=now)


def proceed_approved(request, *, actor):
    """``approvals.PROCEED`` for a class: make it as asked, now (its sessions claimed now, all or
    none; refused as any class would be). Returns its id."""
    data = request.payload
    course = Group.objects.filter(pk=data["course"]).first()
    if course is None:
        raise ValidationError({"course": ["the course was deleted meanwhile"]})
    klass = create_class(
        actor=actor,
        by=request.requester,
        approved=True,
        course=course,
        name=data["name"],
        image=request.image,
        first_day=date.fromisoformat(data["first_day"]),
        last_day=date.fromisoformat(data["last_day"]),
        sessions=[calendar.Session(w, time.fromisoformat(t), m) for w, t, m in data["sessions"]],
        exceptions=[(date.fromisoformat(d), r) for d, r in data["exceptions"]],
        environment=_asked_environment(data.get("environment")),
        **data["more"],
    )
    return klass.pk


def _asked_environment(template_id):
    if template_id is None:
        return None
    template = EnvironmentTemplate.objects.filter(pk=template_id).first()
    if template is None:
        raise ValidationError({"environment": ["the environment was deleted meanwhile"]})
    return template


def change_class(klass, *, actor, by=None, now=None, sessions=None, exceptions=None, **changes):
    """Change a class; the occurrences not yet built are planned again (all or nothing)."""
    actor = Actor.of(actor)
    now = now or timezone.now()
    unknown = set(changes) - set(FIELDS) - set(OTHER)
    if unknown:
        raise ValidationError({name: ["unknown field"] for name in sorted(unknown)})
    values = {k: getattr(klass, k) for k in (*FIELDS, *OTHER)}
    values.update(changes, course=klass.course)
    values["sessions"] = list(sessions) if sessions is not None else _sessions(klass)
    values["exceptions"] = list(exceptions) if exceptions is not None else _exceptions(klass)
    _check(values, by)
    replan = any(values[k] != getattr(klass, k) for k in changes if k not in NOT_PLANNED)
    replan = replan or values["sessions"] != _sessions(klass) or values["exceptions"] != _exceptions(klass)
    _refuse_unapproved(klass, values, by, replan)
    with transaction.atomic():
        klass = Class.objects.select_for_update().get(pk=klass.pk)
        for name in changes:
            setattr(klass, name, values[name].strip() if name == "name" else values[name])
        klass.problem = ""
        klass.save()
        _write_calendar(klass, values["sessions"], values["exceptions"])
        dropped = _unplan(klass, now, "the class was changed", actor=actor, built_too=False) if replan else 0
        made = _plan(klass, now, actor=actor, strict=True)
        reason = f"re-planned: {dropped} dropped, {len(made)} claimed"
        changelog.record(klass, "update", actor, changes={k: str(values[k]) for k in changes}, reason=reason)
    build_due(now, klass=klass, actor=actor)
    return klass


def _refuse_unapproved(klass, values, by, replan):
    """An approval covers the class as approved: for one that needed approval (it requires it,
    or its image does), or a change to an image that does, a change of what is claimed (image,
    seats, size, term, sessions) or dropping ``requires_approval`` would claim what no approver
    saw. Refused for ``by`` (administrators and the system change it at once)."""
    if by is None:
        return
    dropped = klass.requires_approval and not values["requires_approval"]
    gated = klass.requires_approval or klass.image.requires_approval
    if (replan or dropped) and approvals.needs_approval(by, values["image"], gated):
        field = "image" if values["image"] != klass.image else "requires_approval" if dropped else "__all__"
        log.warning("change of class %s refused to %s: it needs approval", klass.pk, by)
        raise ValidationError(
            {field: ["this change needs an approver's approval: ask an administrator, or ask for a new class"]}
        )


def delete_class(klass, *, actor, now=None):
    """Delete a class: every occurrence still to come is canceled and its claims released (one
    under way ends at its time)."""
    actor = Actor.of(actor)
    now = now or timezone.now()
    with transaction.atomic():
        klass = Class.objects.select_for_update().get(pk=klass.pk)
        dropped = _unplan(klass, now, "the class was deleted", actor=actor, built_too=True)
        changelog.record(klass, "delete", actor, reason=f"{dropped} future sessions canceled")
        klass.delete()
    return dropped


def plan_round(now=None, *, actor=PLANNER):
    """The periodic pass: claim the occurrences coming into the look-ahead (each on its own,
    idempotent) and build those whose lead time has come. Returns what it did."""
    now = now or timezone.now()
    done = {"claimed": 0, "refused": 0}
    for pk in _lacking(now):
        with transaction.atomic():
            klass = Class.objects.select_for_update().filter(pk=pk).first()
            if klass is None:  # deleted meanwhile
                continue
            made = _plan(klass, now, actor=actor, strict=False)
        done["claimed"] += len(made)
        done["refused"] += bool(Class.objects.filter(pk=pk).exclude(problem="").exists())
    done["built"] = build_due(now, actor=actor)
    return done


def _lacking(now):
    """Ids of the live classes with an occurrence in the window and no meeting for it (read
    without locks: most rounds lock nothing)."""
    live = Class.objects.filter(last_day__gte=(now - timedelta(days=1)).date())
    live = live.prefetch_related("sessions", "exceptions")
    horizon = now + timedelta(days=settings.CLASS_LOOKAHEAD_DAYS)
    held = set(Meeting.objects.filter(start__gt=now, start__lte=horizon).values_list("klass_id", "start"))
    # (One with a problem too: the problem is cleared once nothing is left unclaimed.)
    return [k.pk for k in live if k.problem or any((k.pk, o.start) not in held for o in _window(k, now))]


def build_due(now=None, *, klass=None, actor=PLANNER):
    """Start building the pending seats of the sessions whose lead time has come; returns how many."""
    now = now or timezone.now()
    meetings = Meeting.objects.filter(block__canceled=False, end__gt=now, start__lte=now + timedelta(days=1))
    if klass is not None:
        meetings = meetings.filter(klass=klass)
    started = 0
    for meeting in meetings.select_related("klass"):
        if meeting.start - timedelta(minutes=meeting.klass.lead_minutes) > now:
            continue
        seats = Reservation.objects.filter(block_id=meeting.block_id, status=S.PENDING).values_list("pk", flat=True)
        for seat in seats:
            if reserving.provision(seat, "the class session starts soon: building the VM", actor=actor):
                started += 1
    return started


# --- reading --------------------------------------------------------------------------------------


def occurrences(klass):
    """Every occurrence of the class's term (``calendar.Occurrence``)."""
    skip = [day for day, _ in _exceptions(klass)]
    return calendar.occurrences(klass.first_day, klass.last_day, _sessions(klass), klass.time_zone, skip)


def upcoming(klass, now=None, limit=5):
    """The next ``limit`` occurrences not over: ``(occurrence, meeting or None)``."""
    now = now or timezone.now()
    found = [o for o in occurrences(klass) if o.end > now][:limit]
    meetings = {m.start: m for m in klass.meetings.filter(start__in=[o.start for o in found]).select_related("block")}
    return [(o, meetings.get(o.start)) for o in found]


def next_seat(user, klass, now=None):
    """``(meeting, seat)``: the class's next session not over that is claimed, and ``user``'s seat
    in it (None: none yet, a free one may be taken); ``(None, None)``: none is claimed yet."""
    now = now or timezone.now()
    meeting = klass.meetings.filter(end__gt=now, block__canceled=False).select_related("block").first()
    if meeting is None:
        return None, None
    seats = Reservation.objects.filter(block_id=meeting.block_id, head__isnull=True)  # an environment's: its head
    seat = seats.filter(user=user, status__in=Reservation.ACTIVE).first()
    return meeting, seat


def seat_counts(meeting):
    return blocks.block_usage(meeting.block) if meeting.block is not None else None


# --- inside -----------------------------------------------------------------------------------------


def _sessions(klass):
    return [calendar.Session(s.weekday, s.start, s.minutes) for s in klass.sessions.all()]


def _exceptions(klass):
    return [(e.day, e.reason) for e in klass.exceptions.all()]


def _write_calendar(klass, sessions, exceptions):
    klass.sessions.all().delete()
    klass.exceptions.all().delete()
    WeeklySession.objects.bulk_create(
        WeeklySession(klass=klass, weekday=s.weekday, start=s.start, minutes=s.minutes) for s in sessions
    )
    NoSessionDay.objects.bulk_create(NoSessionDay(klass=klass, day=d, reason=r[:200]) for d, r in exceptions)


def _window(klass, now):
    """The occurrences to hold claims for now: starting after ``now``, within the look-ahead."""
    horizon = now + timedelta(days=settings.CLASS_LOOKAHEAD_DAYS)
    return [o for o in occurrences(klass) if now < o.start <= horizon]


def _plan(klass, now, *, actor, strict):
    """Claim the window's occurrences that have no meeting yet. ``strict``: the first that does
    not fit refuses the whole (``ValidationError``); else it is noted in ``Class.problem`` and
    the rest are still tried. Runs in the caller's transaction, the class row locked."""
    held = set(klass.meetings.values_list("start", flat=True))
    members = list(klass.course.user_set.filter(is_active=True).order_by("username"))
    made, problems = [], []
    for occurrence in _window(klass, now):
        if occurrence.start in held:
            continue
        if strict:
            made.append(_claim(klass, occurrence, members, now, actor=actor))
            continue
        try:
            with transaction.atomic():
                made.append(_claim(klass, occurrence, members, now, actor=actor))
        except ValidationError as exc:
            problems.append("; ".join(exc.messages))
    if not strict and (problems or klass.problem):
        Class.objects.filter(pk=klass.pk).update(problem="; ".join(problems)[:500])
        if problems:
            log.warning("class %s: %s", klass.pk, problems[0])
    return made


def _claim(klass, occurrence, members, now, *, actor):
    """One occurrence: its block and every seat's claim, or ``ValidationError`` naming it."""
    label = occurrence.label(klass.time_zone)
    image = klass.image
    problems = reserving.validate(None, image, occurrence.start, occurrence.end, now)
    if problems:
        raise ValidationError({"sessions": [f"the session of {label}: {_words(problems)}"]})
    seats = klass.seats or max(1, min(len(members), settings.CLASS_MAX_SEATS))
    size = {"vcpus": klass.vcpus, "memory_mib": klass.memory_mib}
    block = BlockAllocation.objects.create(
        name=f"{klass.name} {label}"[:100],
        image=image,
        group=klass.course,
        seats=seats,
        start=occurrence.start,
        end=occurrence.end,
        weeks=1,
        created_by=klass.created_by,
        environment=klass.environment,
    )
    for seat in range(seats):
        user = members[seat] if seat < len(members) else None
        try:
            if klass.environment is not None:  # the environment's machines, all or nothing
                environments.accept_seat(
                    user, klass.environment, occurrence.start, occurrence.end, block=block, actor=actor
                )
                continue
            if image.max_concurrent is not None:  # seats are the instructor's: only the licence cap binds
                quotas.check_locked(None, image, occurrence.start, occurrence.end, vms.size_for(image, **size))
            reserving.create(
                user,
                image,
                occurrence.start,
                occurrence.end,
                "",
                "",
                size,
                block,
                0,
                actor=actor,
                gpus={"gpus": klass.gpus, "gpu_model": klass.gpu_model},
            )
        except ValidationError as exc:  # the caller's transaction (or savepoint) rolls every claim back
            detail = _words(exc.message_dict if hasattr(exc, "error_dict") else {"": exc.messages}, "start")
            raise ValidationError(
                {"sessions": [f"the session of {label}: seat {seat + 1} of {seats} does not fit: {detail}"]}
            ) from None
    return Meeting.objects.create(klass=klass, start=occurrence.start, end=occurrence.end, block=block)


def _words(errors, first=None):
    if first in errors:
        return "; ".join(errors[first])
    return "; ".join(m for messages in errors.values() for m in messages)


def _unplan(klass, now, reason, *, actor, built_too):
    """Cancel the class's occurrences still to come (``built_too`` False: only those none of
    whose seats is being built yet); returns how many. Their claims are released."""
    dropped = 0
    for meeting in klass.meetings.filter(start__gt=now).select_related("block"):
        block = meeting.block
        if block is not None:
            if not built_too and block.seat_reservations.exclude(status__in=(*UNBUILT, *Reservation.FINAL)).exists():
                continue
            blocks.cancel_block(block, reason, actor=actor)
        meeting.delete()
        dropped += 1
    return dropped
