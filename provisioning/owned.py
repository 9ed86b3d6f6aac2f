"""Images users own (their captures): sharing them with groups, renaming and deleting them.

An image's ``owner`` uses it at once (``Image.objects.visible_to``). ``share`` gives it to
groups (restricted to them): an image maintainer decides for their own groups only, the
image's other groups kept; administrators set them all. The owner (and whoever maintains the
image) renames it while no VM uses it (a revision's rule: ``revisions.DONE``, destroyed and
failed VMs use none) and deletes it while no VM ever did (``services.delete_image``). The
permission checks are ``accounts.access``'s and are made here, so pages and API cannot differ.
"""

from django.db import transaction

from accounts import access
from core.errors import InUse
from provisioning import revisions, services
from provisioning.models import VM, Image


def owned_by(user):
    """``user``'s own images (their captures), newest first."""
    return Image.objects.filter(owner=user).order_by("-created")


def in_use(image):
    """What still uses ``image`` (words), or "": its VMs that are not gone."""
    count = VM.objects.filter(image=image).exclude(state__in=revisions.DONE).count()
    return f"{count} VMs" if count else ""


def share(image, groups, *, actor, reason=""):
    """Restrict ``image`` to ``groups`` (PermissionDenied: ``access.check_image_sharing``); no
    groups: back to its owner (and administrators) only."""
    chosen = access.shared_groups(actor, image, groups)
    return services.update_image(
        image,
        actor=actor,
        groups=chosen,
        visibility=Image.Visibility.RESTRICTED,
        reason=reason or f"shared with {len(chosen)} groups",
    )


def rename(image, name, *, actor, reason=""):
    """Rename ``image`` (its name names its disks' copies on hosts: refused while in use)."""
    access.check_image_ownership(actor, image)
    with transaction.atomic():
        _refuse_in_use(image, "renamed")
        return services.update_image(image, actor=actor, name=name, reason=reason or "renamed")


def delete(image, *, actor, reason=""):
    """Delete ``image``: ``services.delete_image``, whose rule is stricter than ``in_use`` (a
    destroyed VM still names its image), after the owner's or maintainer's check."""
    access.check_image_ownership(actor, image)
    services.delete_image(image, actor=actor, reason=reason or "deleted")


def _refuse_in_use(image, verb):
    Image.objects.select_for_update().filter(pk=image.pk).first()  # no VM is requested meanwhile
    used = in_use(image)
    if used:
        raise InUse(f"image {image.name} is in use by {used}: it cannot be {verb}")
