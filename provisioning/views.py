"""Image library and VM pages. Thin: reads through ``services.visible_*``, writes through services.

Users see the images they may use and their own VMs (anyone else's VM is a 404, not a 403, so
ids do not leak); staff see everything and manage the library. VM actions submit a job.
"""

from collections.abc import Callable

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import Count, ProtectedError, Q
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.html import format_html
from django.views.decorators.http import require_POST
from rest_framework import serializers

from accounts import access
from core import changelog
from core.errors import Conflict
from core.hooks import Hook
from jobs import services as jobs
from provisioning import disks, owned, resizing, revisions, services, uploads
from provisioning.capture_views import capture_context
from provisioning.forms import (
    ActionForm,
    ImageFilterForm,
    ImageForm,
    RenameForm,
    ResizeForm,
    RevisionForm,
    ShareForm,
    VariantForm,
)
from provisioning.models import VM, Image, ImageRevision, ImageVariant

maintainer_page = access.page(read="maintain_images", write="maintain_images")

PAGE_SIZE = 50
UPLOAD_CHUNK = 8 << 20  # bytes per PATCH of the upload form: over DATA_UPLOAD_MAX_MEMORY_SIZE, so streamed
# Cards of the layers above on the image page (reservations: the image's template), filled in
# their ready(): ``(request, image) -> context`` with the card's ``template``, or None (no card).
IMAGE_CARDS: Hook[Callable] = Hook("provisioning.views.IMAGE_CARDS")
MAX_ID = 2**63 - 1
# Which actions a VM's state allows (the buttons shown; the service and the job check again).
ACTIONS_BY_STATE = {
    VM.State.RUNNING: ("stop", "suspend", "snapshot", "revert", "destroy"),
    VM.State.STOPPED: ("start", "snapshot", "revert", "destroy"),
    VM.State.SUSPENDED: ("resume", "snapshot", "revert", "destroy"),
}


def _get(queryset, pk):
    if pk > MAX_ID:  # beyond the column's range: SQLite would raise instead of finding nothing
        raise Http404
    return get_object_or_404(queryset, pk=pk)


def _add_errors(form, exc):
    """A service's ValidationError onto the form, per field where the form has that field."""
    for field, errors in exc.message_dict.items():
        form.add_error(field if field in form.fields else None, errors)


def _flash_errors(request, errors):
    for field, msgs in errors.items():
        messages.error(request, f"{field}: {' '.join(map(str, msgs))}" if field != "__all__" else " ".join(msgs))


# --- images -------------------------------------------------------------------------------


@login_required
def image_list(request):
    visible = services.visible_images(request.user)
    form = ImageFilterForm(request.GET or None, images=visible)
    images = services.with_production_variants(form.filter(visible).select_related("parent")).order_by("name")
    page = Paginator(images, PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    mine = owned.owned_by(request.user).select_related("parent").prefetch_related("groups")[:PAGE_SIZE]
    context = {
        "form": form,
        "page": page,
        "query": query.urlencode(),
        "my_images": mine,
        "upload": _upload_facts(request),
    }
    return render(request, "vms/image_list.html", context)


def _upload_facts(request):
    """What the "Upload an image" form says: the limits, the quota and what the user uses of it."""
    return {
        "chunk": UPLOAD_CHUNK,
        "max_file": disks.size_text(disks.upload_limits()["max_file_bytes"]),
        "quota": disks.size_text(uploads.quota_bytes()),
        "used": disks.size_text(uploads.usage(request.user)),
    }


@login_required
def image_detail(request, pk):
    visible = services.visible_images(request.user)
    image = _get(
        services.with_production_variants(visible.select_related("parent", "owner").prefetch_related("groups")), pk
    )
    context = {
        "image": image,
        "derived": visible.filter(parent=image).order_by("name"),
        "vm_count": image.vms.filter(state__in=VM.LIVE).count(),
        "revisions": _revisions(image),
    }
    if access.may_share_image(request.user, image):
        context["share_form"] = ShareForm(user=request.user, initial={"groups": image.groups.all()})
    if image.owner_id == request.user.pk:
        context["rename_form"] = RenameForm(initial={"name": image.name})
    context["cards"] = [card for card in (make(request, image) for make in IMAGE_CARDS) if card]
    if access.can_maintain_image(request.user, image):
        context.update(
            variant_form=VariantForm(),
            revision_form=RevisionForm(prefix="revision"),
            changes=changelog.history(image),
            maintains=True,
        )
    return render(request, "vms/image_detail.html", context)


@maintainer_page
def image_edit(request, pk=None):
    image = _get(Image.objects.all(), pk) if pk is not None else None
    access.check_image_maintenance(request.user, image)
    form = ImageForm(request.POST or None, instance=image)
    if request.method == "POST" and form.is_valid():
        fields, groups = form.service_fields()
        access.check_image_maintenance(request.user, image, groups)
        try:
            if image is None:
                image = services.create_image(actor=request.user, groups=groups, reason="web UI", **fields)
            else:
                # A fresh copy: the form has already written the new values onto its instance,
                # and the service diffs against the object it is given for the change log.
                fresh = Image.objects.get(pk=pk)
                services.update_image(fresh, actor=request.user, groups=groups, reason="web UI", **fields)
        except ValidationError as exc:
            _add_errors(form, exc)
        else:
            messages.success(request, f"Image {fields['name']} saved.")
            return redirect("vms:image", pk=image.pk)
    return render(request, "vms/image_form.html", {"form": form, "image": image})


@login_required  # its owner too: ``owned.delete`` checks
@require_POST
def image_delete(request, pk):
    image = _get(Image.objects.all(), pk)
    try:
        owned.delete(image, actor=request.user, reason="deleted in the web UI")
    except services.InUse as exc:
        messages.error(request, str(exc))
        return redirect("vms:image", pk=pk)
    except ProtectedError as exc:  # held by rows of other apps (reservations)
        messages.error(request, f"image {image.name} is still used by {len(exc.protected_objects)} objects")
        return redirect("vms:image", pk=pk)
    messages.success(request, f"Image {image.name} deleted.")
    return redirect("vms:images")


@maintainer_page
@require_POST
def variant_add(request, pk):
    image = _get(Image.objects.all(), pk)
    access.check_image_maintenance(request.user, image)
    form = VariantForm(request.POST)
    if form.is_valid():
        try:
            variant = services.add_variant(image, actor=request.user, reason="web UI", **form.cleaned_data)
        except ValidationError as exc:
            _flash_errors(request, exc.message_dict)
        else:
            messages.success(request, f"Variant {variant.hypervisor_type} added.")
    else:
        _flash_errors(request, form.errors)
    return redirect("vms:image", pk=pk)


# Owned images: sharing (maintainers), renaming (owners too); ``owned`` makes the checks.


def _visible(request, pk):
    return _get(services.visible_images(request.user), pk)


@login_required
@require_POST
def image_share(request, pk):
    image = _visible(request, pk)
    if not access.may_share_image(request.user, image):  # before the form: its choices are the user's groups
        raise PermissionDenied
    form = ShareForm(request.POST, user=request.user)
    if not form.is_valid():
        _flash_errors(request, form.errors)
    else:
        groups = list(form.cleaned_data["groups"])
        owned.share(image, groups, actor=request.user, reason="web UI")
        names = ", ".join(g.name for g in groups) or "nobody but its owner"
        messages.success(request, f"Image {image.name}: shared with {names}.")
    return redirect("vms:image", pk=pk)


@login_required
@require_POST
def image_rename(request, pk):
    image = _visible(request, pk)
    form = RenameForm(request.POST)
    if not form.is_valid():
        _flash_errors(request, form.errors)
        return redirect("vms:image", pk=pk)
    try:
        owned.rename(image, form.cleaned_data["name"], actor=request.user, reason="web UI")
    except ValidationError as exc:
        _flash_errors(request, exc.message_dict)
    except Conflict as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Image renamed to {image.name}.")
    return redirect("vms:image", pk=pk)


def _revisions(image):
    """The image's revisions, newest first, with their variants and how many VMs use each."""
    in_use = Count("vms", filter=~Q(vms__state__in=revisions.DONE))
    rows = image.revisions.select_related("created_by", "parent").prefetch_related("variants")
    return rows.annotate(vm_count=in_use).order_by("-number")


@maintainer_page
@require_POST
def revision_add(request, pk):
    image = _get(Image.objects.all(), pk)
    access.check_image_maintenance(request.user, image)
    form = RevisionForm(request.POST, prefix="revision")
    if form.is_valid():
        fields = dict(form.cleaned_data)
        comment = fields.pop("comment")
        try:
            revision = services.add_revision(
                image, actor=request.user, variants=[fields], comment=comment, reason="web UI"
            )
        except ValidationError as exc:
            _flash_errors(request, exc.message_dict)
        else:
            messages.success(request, f"Revision {revision.number} added (testing).")
    else:
        _flash_errors(request, form.errors)
    return redirect("vms:image", pk=pk)


REVISION_ACTIONS = {"production": revisions.make_production, "retire": revisions.retire}


@maintainer_page
@require_POST
def revision_action(request, pk, action):
    revision = _get(ImageRevision.objects.select_related("image"), pk)
    access.check_image_maintenance(request.user, revision.image)
    if action not in (*REVISION_ACTIONS, "delete"):
        raise Http404
    try:
        if action == "delete":
            revisions.delete_revision(revision, actor=request.user, reason="deleted in the web UI")
        else:
            REVISION_ACTIONS[action](revision, actor=request.user, reason="web UI")
    except Conflict as exc:
        messages.error(request, str(exc))
    else:
        done = "deleted" if action == "delete" else f"now {revision.state}"
        messages.success(request, f"Revision {revision.number} of {revision.image.name}: {done}.")
    return redirect("vms:image", pk=revision.image_id)


@maintainer_page
@require_POST
def variant_delete(request, pk):
    variant = _get(ImageVariant.objects.select_related("image"), pk)
    access.check_image_maintenance(request.user, variant.image)
    try:
        services.delete_variant(variant, actor=request.user, reason="deleted in the web UI")
    except services.InUse as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Variant {variant.hypervisor_type} of {variant.image.name} deleted.")
    return redirect("vms:image", pk=variant.image_id)


# --- VMs ----------------------------------------------------------------------------------


@login_required
def vm_list(request):
    vms = services.visible_vms(request.user).select_related("image", "host", "owner")
    state = request.GET.get("state", "")
    if state in VM.State.values:
        vms = vms.filter(state=state)
    page = Paginator(vms.order_by("-id"), PAGE_SIZE).get_page(request.GET.get("page"))
    context = {
        "page": page,
        "state": state,
        "states": VM.State.values,
        "topics": "admin" if access.can(request.user, "see_all") else f"user.{request.user.pk}",
    }
    return render(request, "vms/vm_list.html", context)


@login_required
def vm_detail(request, pk):
    # Operators see any VM's page (its resize form is there); its owner's actions stay the owner's.
    vm = _get(services.operable_vms(request.user).select_related("image", "variant", "host", "owner"), pk)
    owns = services.visible_vms(request.user).filter(pk=vm.pk).exists()
    recent = jobs.visible_to(request.user).filter(params__vm=vm.pk).order_by("-id")
    context = {
        "vm": vm,
        "actions": ACTIONS_BY_STATE.get(vm.state, ("destroy",) if vm.state != VM.State.DESTROYED else ())
        if owns
        else (),
        "snapshots": [s.get("name") for s in vm.snapshots],
        "jobs": recent.only("id", "opcode", "status", "received")[:20],
        "changes": changelog.history(vm),
        "resizable": access.can(request.user, "operate") and vm.state in resizing.BUILT,
        **capture_context(request, vm),
    }
    return render(request, "vms/vm_detail.html", context)


@login_required
@require_POST
def vm_resize(request, pk):
    """Operators change the VM's vCPUs and memory (``resizing.resize``: its claim first)."""
    vm = _get(services.operable_vms(request.user).select_related("image", "allocation"), pk)
    form = ResizeForm(request.POST)
    if not form.is_valid():
        _flash_errors(request, form.errors)
        return redirect("vms:vm", pk=pk)
    try:
        job = resizing.resize(vm, actor=request.user, reason="resize in the web UI", **form.cleaned_data)
    except (Conflict, PermissionDenied) as exc:
        messages.error(request, str(exc))
    except ValidationError as exc:
        _flash_errors(request, exc.message_dict)
    else:
        url = reverse("jobs:job-detail", args=[job.pk])
        messages.success(request, format_html('resize of {} submitted: <a href="{}">job {}</a>.', vm, url, job.pk))
    return redirect("vms:vm", pk=pk)


@login_required
@require_POST
def vm_action(request, pk):
    vm = _get(services.visible_vms(request.user), pk)
    form = ActionForm(request.POST)
    if not form.is_valid():
        _flash_errors(request, form.errors)
        return redirect("vms:vm", pk=pk)
    action, name = form.cleaned_data["action"], form.cleaned_data["name"]
    params = {"name": name} if action in ("snapshot", "revert") else {}
    try:
        job = services.submit_action(vm, action, actor=request.user, reason=f"{action} in the web UI", **params)
    except services.Conflict as exc:
        messages.error(request, str(exc))
    except serializers.ValidationError as exc:  # the job's parameters, checked by the jobs service
        _flash_errors(request, exc.detail if isinstance(exc.detail, dict) else {"__all__": exc.detail})
    else:
        url = reverse("jobs:job-detail", args=[job.pk])
        messages.success(request, format_html('{} of {} submitted: <a href="{}">job {}</a>.', action, vm, url, job.pk))
    return redirect("vms:vm", pk=pk)
