"""Run pages: your runs, one run with its live log (over the websocket), cancel. Thin: reads
through ``services.visible`` (another user's run is a 404), writes through the services."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from core.errors import Conflict
from runs import services
from runs.forms import RunForm, add_service_errors
from runs.models import RunFile

LOG_ON_PAGE = 500  # chunks rendered with the page; the script pages on from there


def _run(request, pk):
    return get_object_or_404(services.visible(request.user).select_related("owner", "image", "vm__host"), pk=pk)


@login_required
def run_list(request):
    form = RunForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        try:
            run = services.submit(
                actor=request.user, owner=request.user, reason="from the runs page", **form.submit_kwargs()
            )
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            return redirect("runs:detail", pk=run.pk)
    runs = services.visible(request.user).select_related("owner", "image").order_by("-id")[:200]
    return render(request, "runs/run_list.html", {"runs": runs, "form": form})


@login_required
def run_detail(request, pk):
    run = _run(request, pk)
    chunks, last = services.log(run, -1, LOG_ON_PAGE)
    text = b"".join(bytes(c.data) for c in chunks).decode("utf-8", "replace")
    context = {
        "run": run,
        "kept_vm": services.kept_vm(run),
        "log_text": text,
        "last_seq": last,
        "note": services.truncation_note(run),
        "artifacts": run.files.filter(kind=RunFile.Kind.ARTIFACT),
        "inputs": run.files.filter(kind=RunFile.Kind.INPUT),
    }
    return render(request, "runs/run_detail.html", context)


@login_required
@require_POST
def run_cancel(request, pk):
    run = get_object_or_404(services.changeable(request.user), pk=pk)
    try:
        services.cancel(run, actor=request.user, reason="canceled from its page")
        messages.success(request, f"Run {run.pk} is being canceled.")
    except Conflict as exc:
        messages.error(request, str(exc))
    return redirect("runs:detail", pk=run.pk)


@login_required
@require_POST
def run_discard(request, pk):
    run = get_object_or_404(services.changeable(request.user), pk=pk)
    try:
        services.discard_kept(run, actor=request.user, reason="discarded from its page")
        messages.success(request, f"Run {run.pk}'s kept VM is being destroyed.")
    except Conflict as exc:
        messages.error(request, str(exc))
    return redirect("runs:detail", pk=run.pk)
