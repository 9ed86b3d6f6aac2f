"""Capture from the VM and reservation pages: the form, the submission, the last capture's progress.

The owner of a VM (a reservation's user) and administrators capture it; the job is the
``vm.capture`` submitted through ``services.submit_action`` as the API and the CLI do. The page
shows the VM's latest capture job, live (``static/js/pages/job_progress.js``), and a link to
the new image once it is done.
"""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from accounts import access
from jobs import services as jobs
from provisioning import services
from provisioning.forms import CaptureForm
from provisioning.models import VM

CAPTURABLE = (VM.State.RUNNING, VM.State.STOPPED, VM.State.SUSPENDED)  # services.NEEDS_BUILT's states


def may_capture(user, vm):
    """The VM's owner and administrators (the job refuses anyone else: ``authorised_vm``)."""
    return vm is not None and (vm.owner_id == user.pk or access.is_admin(user))


def capture_context(request, vm):
    """What ``vms/_capture.html`` shows for ``vm`` on the page ``request`` renders ({}: nothing)."""
    if not may_capture(request.user, vm):
        return {}
    job = jobs.visible_to(request.user).filter(opcode="vm.capture", params__vm=vm.pk).order_by("-id").first()
    image = None
    if job is not None and job.status == "success" and isinstance(job.result, dict):
        image = services.visible_images(request.user).filter(pk=job.result.get("image")).first()
    return {
        "capture_vm": vm,
        "capture_form": CaptureForm(initial={"next": request.get_full_path()}) if vm.state in CAPTURABLE else None,
        "capture_job": job,
        "captured_image": image,
    }


@login_required
@require_POST
def vm_capture(request, pk):
    vm = services.visible_vms(request.user).filter(pk=pk).first()
    if not may_capture(request.user, vm):
        raise Http404
    form = CaptureForm(request.POST)
    back = form.data.get("next", "")
    if not url_has_allowed_host_and_scheme(back, {request.get_host()}, require_https=request.is_secure()):
        back = reverse("vms:vm", args=[vm.pk])
    if not form.is_valid():
        for field, errors in form.errors.items():
            messages.error(request, f"{field}: {' '.join(errors)}")
        return redirect(back)
    data = form.cleaned_data
    try:
        job = services.submit_action(
            vm,
            "capture",
            actor=request.user,
            reason="capture in the web UI",
            image_name=data["image_name"],
            comment=data["comment"],
        )
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    except services.Conflict as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Capturing {vm} as {data['image_name']}: job {job.pk}.")
    return redirect(back)
