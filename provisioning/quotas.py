"""One quota engine for all a user holds: reservations and ad-hoc VMs (and, later, batch runs).

Limits (``limits_for``): the site defaults (``RESERVATION_MAX_MINUTES`` per reservation or VM,
``RESERVATION_MAX_PER_USER`` at once per user), tightened by every ``QuotaRule`` that applies —
its group is one of the user's (or blank: everybody) and its image is this one (or blank: all).
Every limit binds; a rule's limit for one image counts only that image's holdings. The image's
own licence cap (``Image.max_concurrent``) counts every user's. A rule never raises a default
(refused when it is saved; ``limits_for`` takes the smaller value all the same).

Usage: what the registered *holders* hold over a window ("at that time" = overlapping it).
Each app that holds capacity for users registers one at start-up (``register``): the VM app its
ad-hoc VMs (``vm_holdings`` below), ``reservations`` its reservations. This module never imports
the layers above it.

``check`` returns the refusals (per field, in plain words naming the rule); ``check_locked``
counts under locks inside the caller's transaction, which then writes the new holding: the
user's row, then the groups whose totals bind in id order, then the image if it has a licence
cap. Every path (reserve, extend, request a VM, a class block's seats) takes them in this order,
so one user's parallel requests are counted one after the other, never all against one count,
and never deadlock. (SQLite's immediate write transactions serialise every writer already.)
Taking a class seat is never refused by a member's quota: the instructor's block is the group's
allotment (its seats are counted against the image's licence cap when the block is made), and
the seat counts among the member's holdings from then on.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import Q, QuerySet
from django.utils import timezone

from core.hooks import Hook
from provisioning.models import VM, Image, QuotaRule

SITE = "the site default"
# kind -> ``holdings(window)``: ``(vcpus, memory_mib)`` of each of ``kind`` held in the window, as
# a ``values_list`` QuerySet (``held`` sends every holder's in one statement). Reservations and
# runs, above this layer, fill it in their AppConfig.ready().
HOLDERS: Hook[Callable[..., QuerySet]] = Hook("provisioning.quotas.HOLDERS", keyed=True, single=True)


@dataclass(frozen=True)
class Window:
    """Whose holdings to count, and when. ``exclude``: ``(kind, pk)`` of the holding being
    re-checked (an extended reservation counts against the others, not against itself)."""

    start: datetime
    end: datetime | None
    user_id: int | None = None
    group_id: int | None = None
    image_id: int | None = None
    exclude: tuple | None = None

    def narrow(self, rows, kind, user="user_id", group="user__groups"):
        """A holder's ``rows`` of the window's user, group and image, without the holding of
        ``kind`` being re-checked; ``user``/``group``: the lookups of its owner and their groups."""
        for lookup, value in ((user, self.user_id), (group, self.group_id), ("image_id", self.image_id)):
            if value is not None:
                rows = rows.filter(**{lookup: value})
        if self.exclude is not None and self.exclude[0] == kind:
            rows = rows.exclude(pk=self.exclude[1])
        return rows


def held(window):
    """What every holder holds over the window, in one statement (their rows, unioned)."""
    rows = [holdings(window).order_by() for holdings in HOLDERS]
    if not rows:
        return []
    return list(rows[0].union(*rows[1:], all=True)) if len(rows) > 1 else list(rows[0])


@dataclass(frozen=True)
class Limit:
    """One binding limit: ``measure`` (count, vcpus, memory_mib) of what ``who`` holds at once."""

    value: int
    rule: str
    measure: str = "count"
    group: Group | None = None  # None: the user's own (or, with ``everyone``, all users')
    image: Image | None = None  # None: every image
    everyone: bool = False


@dataclass
class Limits:
    """What applies to one user and image."""

    max_minutes: int
    max_minutes_rule: str
    concurrent: list = field(default_factory=list)  # [Limit]

    @property
    def groups(self):
        return sorted({limit.group.pk for limit in self.concurrent if limit.group is not None})


def limits_for(user, image):
    limits = Limits(settings.RESERVATION_MAX_MINUTES, SITE)
    if image is not None and image.max_concurrent is not None:
        limits.concurrent.append(Limit(image.max_concurrent, "its licence cap", image=image, everyone=True))
    if user is None:
        return limits
    strictest = {("count", None, None): Limit(settings.RESERVATION_MAX_PER_USER, SITE)}
    rules = QuotaRule.objects.filter(
        Q(group__isnull=True) | Q(group__in=user.groups.all()), Q(image__isnull=True) | Q(image=image)
    ).select_related("group", "image")
    for rule in rules:  # every rule binds: per kind of limit, the strictest wins
        name = f"rule '{rule.name}'"
        if rule.max_duration_minutes is not None and rule.max_duration_minutes < limits.max_minutes:
            limits.max_minutes, limits.max_minutes_rule = rule.max_duration_minutes, name
        scoped = rule.image if rule.image_id else None
        candidates = [(rule.max_per_user, "count", None)]
        if rule.group_id is not None:
            candidates += [
                (rule.max_per_group, "count", rule.group),
                (rule.max_vcpus, "vcpus", rule.group),
                (rule.max_memory_mib, "memory_mib", rule.group),
            ]
        for value, measure, group in candidates:
            key = (measure, group.pk if group else None, scoped.pk if scoped else None)
            if value is not None and (key not in strictest or value < strictest[key].value):
                strictest[key] = Limit(value, name, measure, group, scoped)
    limits.concurrent.extend(strictest.values())
    return limits


def human_minutes(minutes):
    hours, rest = divmod(int(minutes), 60)
    if not hours:
        return f"{rest} min"
    return f"{hours} h" + (f" {rest} min" if rest else "")


def check(user, image, start, end, size, *, limits=None, exclude=None, when_field="start", copies=1):
    """Refusals of one more holding of ``image`` (``size``: vcpus, memory_mib) by ``user`` over
    ``[start, end)``, as ``{field: [message]}`` (empty: within every limit). Duration refusals
    go under ``end``, the others under ``when_field``. ``copies``: how many VMs of ``image`` the
    holding is (an environment's machines of it), for the limits of that image (a licence cap
    counts copies); every other limit counts the holding once."""
    limits = limits or limits_for(user, image)
    errors = {}
    if end is not None:
        minutes = (end - start).total_seconds() / 60
        if minutes > limits.max_minutes:
            errors["end"] = [
                f"at most {human_minutes(limits.max_minutes)} for {image.name} ({limits.max_minutes_rule}); "
                f"this is {human_minutes(minutes)}"
            ]
    for limit in limits.concurrent:
        if user is None and not limit.everyone:
            continue
        window = Window(
            start,
            end,
            user_id=None if limit.everyone or limit.group else user.pk,
            group_id=limit.group.pk if limit.group else None,
            image_id=limit.image.pk if limit.image else None,
            exclude=exclude,
        )
        message = _refusal(limit, held(window), size, copies if limit.image is not None else 1)
        if message:
            errors.setdefault(when_field, []).append(message)
    return errors


def _refusal(limit, rows, size, copies=1):
    of = f" of {limit.image.name}" if limit.image is not None and not limit.everyone else ""
    if limit.measure == "count":
        if len(rows) + copies <= limit.value:
            return None
        things = _things(len(rows), of)
        more = f"; this asks for {copies}" if copies > 1 else ""
        if limit.everyone:
            return (
                f"{limit.image.name} may run at most {limit.value} at once ({limit.rule}); "
                f"{things} already overlap that time{more}"
            )
        who = f"group {limit.group.name} already has" if limit.group else "you already have"
        return f"{who} {things} at that time; at most {limit.value} ({limit.rule}){more}"
    index, unit = (0, "vCPUs") if limit.measure == "vcpus" else (1, "MiB of memory")
    total, more = sum(row[index] for row in rows), size[limit.measure]
    if total + more <= limit.value:
        return None
    return (
        f"group {limit.group.name} already holds {total} {unit}{of} at that time; {more} more would make "
        f"{total + more}, at most {limit.value} ({limit.rule})"
    )


def _things(count, of=""):
    return f"{count} reservation{'s' if count != 1 else ''} or VM{'s' if count != 1 else ''}{of}"


def check_locked(user, image, start, end, size, *, exclude=None, when_field="start", copies=1):
    """``check`` counted under the quota locks (see the module docstring); ``ValidationError``."""
    limits = limits_for(user, image)
    # Row locks where the database has them; SQLite's write transaction (BEGIN IMMEDIATE)
    # serialises every writer already, and would only read the rows for nothing.
    if connection.features.has_select_for_update:
        if user is not None:
            list(get_user_model().objects.select_for_update(no_key=True).filter(pk=user.pk).values_list("pk"))
            if limits.groups:
                groups = Group.objects.select_for_update(no_key=True).filter(pk__in=limits.groups).order_by("pk")
                list(groups.values_list("pk"))
        if image.max_concurrent is not None:
            list(Image.objects.select_for_update(no_key=True).filter(pk=image.pk).values_list("pk"))
    errors = check(user, image, start, end, size, limits=limits, exclude=exclude, when_field=when_field, copies=copies)
    if errors:
        raise ValidationError(errors)


# --- the VM app's own holder: ad-hoc VMs -------------------------------------------------

# A VM holds its share from its request until it is gone: requested, on a host, or failed with
# its claim kept (a cleanup that failed: it may still be there).
_EXISTS = Q(state__in=(VM.State.REQUESTED, *VM.LIVE)) | Q(allocation__isnull=False, allocation__released__isnull=True)


def vm_holdings(window):
    """Ad-hoc VMs (a reservation's VM is counted as the reservation) over the window. A VM is
    held from its creation to its end, and past its end for as long as it exists."""
    rows = VM.objects.filter(_EXISTS, adhoc=True)
    if window.end is not None:
        rows = rows.filter(created__lt=window.end)
    if window.start > timezone.now():  # an overdue VM still exists now, not in the future
        rows = rows.filter(Q(end__isnull=True) | Q(end__gt=window.start))
    rows = window.narrow(rows, "vm", user="owner_id", group="owner__groups")
    return rows.values_list("vcpus", "memory_mib")
