"""Image revisions: the verbs (Apache VCL's model). Web, API and CLI call these.

An image has numbered revisions; one is ``production``: new VMs (ad hoc, reservations, class
seats, batch runs) are built from its variants, and each VM records the revision it was
built from and keeps it (a rebuild, repair or reuse too). A new revision starts as
``testing``. ``make_production`` is the roll-back (or forward): the revision it replaces
becomes ``testing`` again, so rolling back is undone the same way; nothing is retired or
removed by it. ``retire`` takes a revision out of use for good (it can still be made
production). ``delete_revision`` refuses the production revision and a revision still used by
a VM (any not destroyed or failed); otherwise it submits one ``image.unstage`` job per host
that holds a copy of its disks (a copy another variant shares is kept) and deletes its rows.

Every verb takes ``actor=``, locks the image's row (revision numbers and the one production
revision are decided under it) and writes the change log.
"""

from django.db import IntegrityError, transaction
from django.db.models import F, ProtectedError, Q

from core import changelog, events
from core.errors import Conflict, InUse
from jobs import services as jobs
from provisioning.models import VM, HostImage, Image, ImageRevision

State = ImageRevision.State
DONE = (VM.State.DESTROYED, VM.State.FAILED)  # VMs no longer on any host: they hold no revision


def production(image):
    """The image's production revision, or None."""
    return image.revisions.filter(state=State.PRODUCTION).first()


def production_for_variant(image, *, actor):
    """The revision a variant added to ``image`` without naming one joins: the production
    revision; an image without any revision gets revision 1, in production."""
    lock(image)
    found = production(image)
    if found is not None:
        return found
    if image.revisions.exists():
        raise Conflict(f"image {image.name} has no production revision: name the revision")
    revision = ImageRevision.objects.create(image=image, number=1, state=State.PRODUCTION, created_by=user_of(actor))
    changelog.record(revision, "create", actor, reason="the image's first revision")
    return revision


def make_production(revision, *, actor, reason=""):
    """Make ``revision`` its image's production revision (the roll-back, or forward): new VMs
    are built from it; the revision it replaces becomes ``testing``. VMs keep theirs."""
    with transaction.atomic():
        lock(revision.image)
        revision.refresh_from_db()
        if revision.state == State.PRODUCTION:
            raise Conflict(f"{revision.image.name} revision {revision.number} is production already")
        if not revision.variants.exists():
            raise Conflict(f"{revision.image.name} revision {revision.number} has no variant: nothing to build from")
        previous = production(revision.image)
        if previous is not None:  # first: at most one production revision per image, at every moment
            _set_state(previous, State.TESTING, actor, reason or f"revision {revision.number} made production")
        _set_state(revision, State.PRODUCTION, actor, reason)
        events.emit("image.updated", _event(revision), ["admin"])
    return revision


def retire(revision, *, actor, reason=""):
    """Retire a revision that is not production: never offered again unless made production;
    the VMs built from it keep running."""
    with transaction.atomic():
        lock(revision.image)
        revision.refresh_from_db()
        if revision.state == State.PRODUCTION:
            raise Conflict(
                f"{revision.image.name} revision {revision.number} is production: make another one production first"
            )
        if revision.state != State.RETIRED:
            _set_state(revision, State.RETIRED, actor, reason)
    return revision


def delete_revision(revision, *, actor, reason=""):
    """Delete a revision no VM uses (never the production one); its copies on hosts are
    removed by ``image.unstage`` jobs (returned), the library's own source is left alone."""
    with transaction.atomic():
        lock(revision.image)
        revision.refresh_from_db()
        name = f"{revision.image.name} revision {revision.number}"
        if revision.state == State.PRODUCTION:
            raise Conflict(f"{name} is production: make another one production first")
        used = in_use(revision)
        if used:
            raise InUse(f"{name} is in use by {used}")
        copies = _copies_to_remove(revision)
        # Destroyed VMs keep their history in the change log; they stop pointing at the rows.
        _vms_of(revision).filter(state__in=DONE).update(revision=None, variant=None)
        changelog.record(revision, "delete", actor, reason=reason)
        submitted = [
            jobs.submit(
                "image.unstage",
                {"hypervisor": host_id, "location": location},
                actor=actor,
                reason=f"{name} deleted",
                savepoint=False,
            )
            for host_id, location in copies
        ]
        try:
            revision.delete()
        except (IntegrityError, ProtectedError):  # a VM given one of its variants meanwhile
            raise InUse(f"{name} is in use") from None
        events.emit("image.updated", _event(revision), ["admin"])
    return submitted


def in_use(revision):
    """What still uses ``revision`` (words), or "": VMs built (or to be built) from it that are not gone."""
    count = _vms_of(revision).exclude(state__in=DONE).count()
    return f"{count} VMs" if count else ""


def _vms_of(revision):
    # A reservation's VM is given its variant when requested, and its revision when placed.
    return VM.objects.filter(Q(revision=revision) | Q(variant__revision=revision))


def _copies_to_remove(revision):
    """``(host id, location)`` of the copies of the revision's disks that ``stage`` made on
    hosts, but for those another variant's cache row names (two revisions of one disk share it)."""
    rows = HostImage.objects.filter(variant__revision=revision).exclude(location="")
    rows = rows.exclude(location=F("variant__location"))  # the library's own disk, used in place: not a copy
    copies = set(rows.values_list("host_id", "location"))
    shared = set(
        HostImage.objects.filter(location__in={loc for _, loc in copies})
        .exclude(variant__revision=revision)
        .values_list("host_id", "location")
    )
    return sorted(copies - shared)


def _set_state(revision, state, actor, reason):
    changes = {"state": [revision.state, state]}
    revision.state = state
    revision.save(update_fields=["state"])
    changelog.record(revision, "update", actor, changes, reason)


def lock(image):
    """The image's row, locked: revision numbers and the production revision are decided under it."""
    Image.objects.select_for_update().filter(pk=image.pk).first()


def user_of(actor):
    return changelog.Actor.of(actor).user


def _event(revision):
    return {"id": revision.image_id, "name": revision.image.name, "revision": revision.number, "state": revision.state}
