"""Who sees which reservations: a user their own, an instructor also their groups' blocks,
auditors and administrators all. ``may_see`` authorises the ``reservation.<id>`` topic."""

from django.db.models import Q

from accounts import access
from reservations.models import Reservation


def visible(user):
    """A user's own reservations; an instructor's also those of their groups' blocks; all for
    auditors and administrators."""
    if access.can(user, "see_all"):
        return Reservation.objects.all()
    if access.can(user, "teach"):
        return Reservation.objects.filter(Q(user=user) | Q(block__group__in=access.teaching_groups(user))).distinct()
    return Reservation.objects.filter(user=user)


def may_see(user, rest):
    """Topic authoriser for ``reservation.<id>``: whoever may see it (``visible``)."""
    if not rest.isdigit() or len(rest) > 18:
        return False
    return visible(user).filter(pk=int(rest)).exists()
