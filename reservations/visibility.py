"""Who sees which reservations: a user their own, an instructor also their groups' blocks, an
image maintainer also the templates of their groups' images, auditors and administrators all.
``may_see`` authorises the ``reservation.<id>`` topic; ``operable``: those a user may power."""

from django.db.models import Q

from accounts import access
from reservations.models import Reservation


def visible(user):
    """A user's own reservations; an instructor's also those of their groups' blocks; an image
    maintainer's also the templates of their groups' images; all for auditors and administrators."""
    if access.can(user, "see_all"):
        return Reservation.objects.all()
    mine = Q(user=user)
    if access.can(user, "teach"):
        mine |= Q(block__group__in=access.teaching_groups(user))
    if access.can(user, "maintain_images"):
        mine |= Q(template_of__groups__in=access.maintained_groups(user))
    if mine == Q(user=user):
        return Reservation.objects.filter(mine)
    return Reservation.objects.filter(mine).distinct()


def operable(user):
    """The reservations ``user`` may power (suspend, resume, revert): their own; every one for
    administrators. Seeing one (an auditor, an instructor) is not enough."""
    if access.is_admin(user):
        return Reservation.objects.all()
    return Reservation.objects.filter(user=user)


def may_see(user, rest):
    """Topic authoriser for ``reservation.<id>``: whoever may see it (``visible``)."""
    if not rest.isdigit() or len(rest) > 18:
        return False
    return visible(user).filter(pk=int(rest)).exists()
