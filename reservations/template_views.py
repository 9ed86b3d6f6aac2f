"""The template card of the image page: an image's template (``reservations.templates``) for
its maintainers — its state, Start / Publish (testing or production) / Discard, Test for each
testing revision, and the last publish's live progress (``static/js/pages/job_progress.js``)
with "Make production" for the revision it made. The image page is provisioning's: it asks
``provisioning.views.IMAGE_CARDS`` (filled at start-up) for this card."""

from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from accounts import access
from core.errors import Conflict
from jobs.models import Job
from provisioning import services as vms
from provisioning.models import ImageRevision
from reservations import services, templates


def template_card(request, image):
    """The card's context for ``image`` on its page (None: not the user's to maintain)."""
    if not access.can_maintain_image(request.user, image):
        return None
    job = Job.objects.filter(opcode="vm.capture", params__image=image.pk).order_by("-id").first()
    made = None
    if job is not None and job.status == Job.Status.SUCCESS and isinstance(job.result, dict):
        made = image.revisions.filter(number=job.result.get("revision")).first()
    return {
        "template": "reservations/_image_template.html",
        "image": image,
        "open": services.open_template(image),
        "job": job,
        "made": made,
        "testing": image.revisions.filter(state=ImageRevision.State.TESTING).order_by("-number"),
        "days": templates.TEMPLATE_DAYS,
    }


@login_required
@require_POST
def start(request, pk):
    image = _image(request, pk)
    return _act(request, image, "Template started: its VM is being built.", services.start_template, image)


@login_required
@require_POST
def publish(request, pk):
    image = _image(request, pk)
    production = request.POST.get("production") == "1"
    template = services.open_template(image)
    if template is None:
        messages.error(request, f"{image.name} has no template.")
        return redirect("vms:image", pk=image.pk)
    comment, keep = request.POST.get("comment", "")[:1000], request.POST.get("keep") == "1"
    done = f"Publishing the template as a new {'production' if production else 'testing'} revision."
    return _act(request, image, done, services.publish, template, production=production, comment=comment, keep=keep)


@login_required
@require_POST
def discard(request, pk):
    image = _image(request, pk)
    template = services.open_template(image)
    if template is None:
        messages.error(request, f"{image.name} has no template.")
        return redirect("vms:image", pk=image.pk)
    return _act(request, image, "Template discarded: its VM is being torn down.", services.discard, template)


@login_required
@require_POST
def test(request, pk):
    visible = vms.visible_images(request.user).values("pk")
    revision = get_object_or_404(ImageRevision.objects.select_related("image"), pk=pk, image__in=visible)
    try:
        reservation = services.test_revision(
            revision.image, revision, duration=timedelta(minutes=templates.TEST_MINUTES), actor=request.user
        )
    except (ValidationError, Conflict, PermissionDenied) as exc:
        messages.error(request, _words(exc))
        return redirect("vms:image", pk=revision.image_id)
    messages.success(request, f"Revision {revision.number} reserved to test it.")
    return redirect("reservations:detail", pk=reservation.pk)


def _image(request, pk):
    return get_object_or_404(vms.visible_images(request.user), pk=pk)


def _act(request, image, done, verb, *args, **kwargs):
    try:
        verb(*args, actor=request.user, **kwargs)
    except (ValidationError, Conflict, PermissionDenied) as exc:
        messages.error(request, _words(exc))
    else:
        messages.success(request, done)
    return redirect("vms:image", pk=image.pk)


def _words(exc):
    return " ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc)
