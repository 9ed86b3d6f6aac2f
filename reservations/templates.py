"""An image's template: the maintainers' loop that makes its next revision.

An image maintainer (of one of the image's groups, or an administrator) starts the image's
template (``start_template``): a reservation flagged ``template_of`` the image, its VM built
from the production revision (or one they name), theirs to change by console and SSH. It
lasts ``TEMPLATE_DAYS`` (a long end, not none: its claim on a host needs one, and a template
forgotten for a month gives its host back; extending it is limited by the host's room only),
is never counted by the quota engine (``reserving.holdings``) nor reclaimed when idle, and
the image's maintainers and the administrators see it. An image has at most one open
template (a constraint on the table: two maintainers starting one at once get one template
and a ``Conflict``).

``publish`` captures the template's VM as the image's next revision (``vm.capture`` with a
target image), testing or production as asked; then a ``reservation.end_template`` job that
waits for the capture's success ends the template (its VM destroyed), unless ``keep``: the
template goes on (its VM stopped by the capture) for the next round. A failed capture leaves
the template as it was. ``discard`` ends it without a revision. ``test_revision`` reserves a
revision as a student would (their quotas counted), pinned to it: its VM is built from that
revision whatever is production then.
"""

from datetime import timedelta

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from accounts import access
from core.changelog import Actor
from core.errors import Conflict
from jobs import services as jobs
from jobs import transitions
from jobs.models import Job
from provisioning import revisions
from provisioning import services as vms
from provisioning.models import ImageRevision
from reservations import ending, reserving, status
from reservations.models import Reservation

S = Reservation.Status
TEMPLATE_DAYS = 30
TEST_MINUTES = 60  # a revision under test is reserved for this long unless asked otherwise
OPEN = (*Reservation.ACTIVE, S.ENDING)  # what the one-template constraint counts


def open_template(image):
    """The image's open template, or None."""
    return Reservation.objects.filter(template_of=image, status__in=OPEN).select_related("user", "vm").first()


def start_template(image, *, revision=None, actor, ssh_key="", size=None, now=None):
    """Start ``image``'s template, built from ``revision`` (default: production); returns the
    reservation. ``PermissionDenied`` unless the actor maintains the image; ``Conflict`` when it
    has an open template already."""
    user = _maintainer(image, actor)
    revision = revision or revisions.production(image)
    if revision is None or revision.image_id != image.pk:
        raise ValidationError({"revision": [f"not a revision of {image.name}"]})
    if not revision.variants.exists():
        raise ValidationError({"revision": [f"{image.name} revision {revision.number} has no variant to build from"]})
    _refuse_second(image)
    now = now or timezone.now()
    end = now + timedelta(days=TEMPLATE_DAYS)
    try:
        with transaction.atomic(), transitions.batched():
            unsaved = status.Unsaved()
            template = reserving.create(
                user,
                image,
                now,
                end,
                ssh_key,
                "",
                size or {},
                actor=actor,
                rank=reserving._rank(now, now),
                unsaved=unsaved,
                revision=revision,
                template=True,
            )
            reserving.provision(template, "building the template's VM", actor=actor, savepoint=False, unsaved=unsaved)
            unsaved.write(template)
    except IntegrityError:  # another maintainer's template was started meanwhile
        _refuse_second(image)
        raise
    return template


def publish(template, *, production=False, comment="", keep=False, actor):
    """Capture the template's VM as ``template.template_of``'s next revision (production at once
    with ``production``, else testing); returns the capture job. The template ends once the
    capture succeeded, unless ``keep``."""
    image = _template_image(template)
    _maintainer(image, actor)
    if template.status != S.READY or template.vm is None:
        raise Conflict(f"the template of {image.name} is {template.status}: it can be published once ready")
    busy = (*Job.PENDING, Job.Status.RUNNING)
    if Job.objects.filter(opcode="vm.capture", params__vm=template.vm_id, status__in=busy).exists():
        raise Conflict(f"the template of {image.name} is being published already: wait for that job")
    number = (image.revisions.aggregate(n=Max("number"))["n"] or 0) + 1
    # The captured disk's name on the host: the template's too, so that a revision number used
    # again (its revision deleted) never names an older copy.
    disk = f"{image.name[:80]}-r{number}-t{template.pk}"
    with transaction.atomic():
        job = vms.submit_action(
            template.vm,
            "capture",
            actor=actor,
            submitter=template.user,  # the VM's owner: the capture acts on it
            reason=f"publish the template of {image.name}",
            image_name=disk,
            image=image.pk,
            production=production,
            comment=comment,
        )
        if not keep:
            jobs.submit(
                "reservation.end_template",
                {"reservation": template.pk},
                actor=actor,
                submitter=template.user,
                reason=f"the template of {image.name} published",
                depends=[(job.pk, ["success"])],
                savepoint=False,
            )
    return job


def end_published(template_id, *, actor):
    """After a successful publish: end the template (its VM torn down). Idempotent."""
    template = Reservation.objects.get(pk=template_id)
    if template.status in Reservation.FINAL or template.status == S.ENDING:
        return {"status": template.status}
    ending.end(template, "published as a new revision", actor=actor)
    return {"status": S.ENDING}


def discard(template, *, actor):
    """End the template without a revision (its VM torn down)."""
    image = _template_image(template)
    _maintainer(image, actor)
    return ending.end(template, "template discarded", actor=actor)


def test_revision(image, revision, *, actor, duration=None, ssh_key=""):
    """Reserve ``revision`` of ``image`` as a student would (quotas counted), its VM built from
    that revision; for the image's maintainers. Returns the reservation."""
    user = _maintainer(image, actor)
    if revision.image_id != image.pk:
        raise ValidationError({"revision": [f"not a revision of {image.name}"]})
    if revision.state == ImageRevision.State.RETIRED:
        raise Conflict(f"{image.name} revision {revision.number} is retired: make it production to use it again")
    return reserving.reserve(
        user,
        image,
        actor=actor,
        duration=duration or timedelta(minutes=TEST_MINUTES),
        ssh_key=ssh_key,
        revision=revision,
    )


def _maintainer(image, actor):
    """The acting user, if they may maintain ``image`` (``PermissionDenied`` otherwise)."""
    user = Actor.of(actor).user
    access.check_image_maintenance(user, image)
    if user is None:
        raise Conflict("a template is a user's: name the maintainer who acts")
    return user


def _template_image(reservation):
    if reservation.template_of_id is None:
        raise Conflict(f"reservation {reservation.pk} is not an image's template")
    if reservation.status not in OPEN:
        raise Conflict(f"the template (reservation {reservation.pk}) is {reservation.status} already")
    return reservation.template_of


def _refuse_second(image):
    found = open_template(image)
    if found is not None:
        raise Conflict(
            f"{image.name} has a template already (reservation {found.pk}, started by {found.user}): "
            "publish or discard it first"
        )
