"""Block allocations (classes): seats of an image for a group, each week, all claimed at once or
none; who may make and cancel them, a member taking a seat, a block's usage."""

import logging
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from accounts import access, preferences
from core import changelog, localtime
from core.changelog import Actor
from core.errors import Conflict
from environments import services as environment_services
from provisioning import quotas
from provisioning import services as vms
from provisioning.models import VM
from reservations import approvals, ending, environments, reserving, status
from reservations.models import BlockAllocation, Reservation

log = logging.getLogger(__name__)
S = Reservation.Status


def may_manage_blocks(user):
    """Instructors (``accounts.access``; the older ``add_blockallocation`` permission counts too)."""
    return access.can(user, "teach") or user.has_perm("reservations.add_blockallocation")


def managed_blocks(user):
    """The blocks ``user`` may cancel: administrators any, an instructor those of their groups."""
    blocks = BlockAllocation.objects.select_related("image", "group")
    if access.is_admin(user):
        return blocks
    return blocks.filter(group__in=teaching_groups(user)) if may_manage_blocks(user) else blocks.none()


def teaching_groups(user):
    """``access.teaching_groups``, for the older permission too: never a role group."""
    if access.is_admin(user):
        return Group.objects.all()
    return access.taught_of(user, access.own_groups(user)) if may_manage_blocks(user) else Group.objects.none()


def create_block(
    *, actor, name, image=None, group, seats, start, end, weeks=1, created_by=None, now=None, time_zone=None,
    environment=None,
):  # fmt: skip
    """Reserve ``seats`` of ``image`` for ``group`` each week; all occurrences claimed at once or none.
    ``environment``: each seat is that template's machines (``image``: its entry machine's, or
    None), one ``created_by`` may reserve (``reservations.environments``' rule).

    The weeks repeat at the same local hour in ``time_zone`` (default: the zone of ``created_by``,
    else the active one), so a class at 14:00 stays at 14:00 across a change of daylight saving
    time; each occurrence lasts as long as the first."""
    actor = Actor.of(actor)
    if time_zone is None:
        time_zone = preferences.zone_of(created_by) if created_by is not None else timezone.get_current_timezone()
    now = now or timezone.now()
    image = _seat_image(created_by, image, environment)
    errors = _field_errors(name, group, seats, weeks)
    errors.update({k: v for k, v in reserving.validate(None, image, start, end, now).items() if k not in errors})
    if environment is not None and image != environments.entry_image(environment):
        errors["image"] = [f"a seat of {environment.name} is its entry machine's image, not {image.name}"]
    if errors:
        raise ValidationError(errors)
    if created_by is not None and not teaching_groups(created_by).filter(pk=group.pk).exists():
        log.warning("block for group %s refused to %s: not one of their groups", group.name, created_by)
        raise PermissionDenied(f"you may only make blocks for your own groups, not {group.name}")
    gated = _gated(created_by, image, environment) if created_by is not None else []
    if gated:
        # A block claims seats at once: it would pass around the approval a reservation waits for.
        names = ", ".join(i.name for i in gated)
        verb = "need" if len(gated) > 1 else "needs"
        refusal = f"{names} {verb} an approver's approval: an administrator makes its blocks"
        raise ValidationError({"environment" if environment is not None else "image": [refusal]})
    members = list(group.user_set.filter(is_active=True).order_by("username")) if isinstance(group, Group) else []
    with transaction.atomic():
        block = BlockAllocation.objects.create(
            name=name.strip(),
            image=image,
            group=group,
            seats=seats,
            start=start,
            end=end,
            weeks=weeks,
            created_by=created_by,
            environment=environment,
        )
        length = end - start
        for week, begins in enumerate(localtime.weekly(start, time_zone, weeks)):
            for seat in range(int(seats)):
                user = members[seat] if seat < len(members) else None
                try:
                    _claim_seat(user, block, begins, begins + length, week, actor=actor)
                except ValidationError as exc:  # all or nothing: roll every claim back
                    detail = "; ".join(exc.message_dict.get("start", exc.messages))
                    raise ValidationError(
                        {"seats": [f"week {week + 1}, seat {seat + 1} of {seats} does not fit: {detail}"]}
                    ) from None
        changelog.record(block, "create", actor, reason=f"{seats} seats × {weeks} weeks for {group.name}")
    due = start - timedelta(minutes=settings.RESERVATION_LEAD_MINUTES) <= now
    if due:
        for seat_id in block.seat_reservations.filter(occurrence=0).values_list("pk", flat=True):
            reserving.provision(seat_id, "pre-provisioning a class seat", actor=actor)
    return block


def _seat_image(created_by, image, environment):
    """A seat's image: ``image``, or ``environment``'s entry machine's (a template that
    ``created_by`` may reserve)."""
    if environment is not None:
        if created_by is not None:
            environments.check_template(created_by, environment)
        image = image or environments.entry_image(environment)
    if image is None:
        raise ValidationError({"image": ["give an image or an environment"]})
    return image


def _field_errors(name, group, seats, weeks):
    errors = {}
    if not name.strip():
        errors["name"] = ["give the block a name"]
    if not isinstance(group, Group):
        errors["group"] = ["no such group"]
    if not (1 <= int(seats) <= 1000):
        errors["seats"] = ["between 1 and 1000 seats"]
    if not (1 <= int(weeks) <= 52):
        errors["weeks"] = ["between 1 and 52 weeks"]
    return errors


def _gated(user, image, environment):
    """The images of a seat (``image``, or every machine's of ``environment``) that wait for
    an approver when ``user`` asks for them."""
    if environment is None:
        return [image] if approvals.needs_approval(user, image) else []
    return environments.gated_images(user, environment_services.expand(environment))


def _claim_seat(user, block, start, end, occurrence, *, actor):
    """One seat of one occurrence: one VM of the block's image, or its environment's machines."""
    if block.environment is not None:
        environments.accept_seat(user, block.environment, start, end, block=block, occurrence=occurrence, actor=actor)
        return
    image = block.image
    if image.max_concurrent is not None:  # seats are the instructor's: only the licence cap binds
        quotas.check_locked(None, image, start, end, vms.size_for(image))
    reserving.create(user, image, start, end, "", "", {}, block, occurrence, actor=actor)


def take_seat(user, block, now=None, *, actor):
    """A member of the block's group takes a free seat of the current or next occurrence."""
    now = now or timezone.now()
    if block.canceled or not user.groups.filter(pk=block.group_id).exists():
        raise ValidationError({"block": ["you are not in this class's group"]})
    seats = block.seat_reservations.filter(head__isnull=True)  # an environment's seat is its head
    upcoming = seats.filter(status__in=Reservation.ACTIVE, end__gt=now).order_by("start", "pk")
    held = upcoming.filter(user=user).first()
    if held is not None:
        return held
    for seat in upcoming.filter(user__isnull=True):
        with transaction.atomic():
            if Reservation.objects.filter(pk=seat.pk, user__isnull=True).update(user=user):
                machines = Reservation.objects.filter(head=seat)  # (none: a seat of one image)
                machines.update(user=user)
                vm_ids = [seat.vm_id, *machines.values_list("vm_id", flat=True)]
                VM.objects.filter(pk__in=[v for v in vm_ids if v]).update(owner=user)
                seat.refresh_from_db()
                status.history(seat, f"seat taken by {user.get_username()}")
                return seat
    reserving.refused(user, block.image, {reserving.SEATS: 1}, now, group=block.group.name)
    raise ValidationError({"block": ["every seat is taken"]})


def block_usage(block, now=None):
    now = now or timezone.now()
    heads = block.seat_reservations.filter(head__isnull=True)  # an environment's seat is its head
    current = heads.filter(end__gt=now).order_by("occurrence").values_list("occurrence", flat=True).first()
    seats = heads.filter(occurrence=current if current is not None else block.weeks - 1)
    return {
        "occurrence": (current or 0) + 1,
        "seats": block.seats,
        "taken": seats.filter(user__isnull=False).count(),
        "ready": seats.filter(status=S.READY).count(),
        "failed": seats.filter(status=S.FAILED).count(),
    }


def cancel_block(block, reason="block canceled", *, actor):
    actor = Actor.of(actor)
    BlockAllocation.objects.filter(pk=block.pk).update(canceled=True)
    for seat in block.seat_reservations.filter(status__in=Reservation.ACTIVE):
        try:
            ending.end(seat, reason, actor=actor)
        except Conflict:
            pass
