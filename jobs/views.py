"""Jobs pages: the list (live status), a job with its live log, submit, cancel, retry, the queue."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST
from rest_framework import serializers

from accounts import access
from jobs import registry, services
from jobs.forms import JobActionForm, JobSubmitForm, QueueForm
from jobs.models import Job, QueueSettings

PAGE_SIZE = 50


def _visible_job(user, pk, queryset=None):
    """The job if this user may see it; 404 otherwise (also for ids beyond the column's range)."""
    if pk > services.MAX_ID:
        raise Http404
    return get_object_or_404(services.visible_to(user) if queryset is None else queryset, pk=pk)


def _errors(exc):
    """A service's ValidationError as one line per field."""
    detail = exc.detail
    if isinstance(detail, dict):
        return [
            f"{field}: {' '.join(map(str, msgs if isinstance(msgs, list) else [msgs]))}"
            for field, msgs in detail.items()
        ]
    return [str(item) for item in detail]


@login_required
def job_list(request):
    jobs = services.visible_to(request.user).select_related("submitter").filter(archived=False)
    status = request.GET.get("status", "")
    if status in Job.Status.values:
        jobs = jobs.filter(status=status)
    page = Paginator(jobs.order_by("-id"), PAGE_SIZE).get_page(request.GET.get("page"))
    queue = QueueSettings.get()
    context = {
        "page": page,
        "status": status,
        "statuses": Job.Status.values,
        "submit_form": JobSubmitForm(user=request.user),
        "queue_form": QueueForm(
            initial={"limit": queue.limit, "lease_seconds": queue.lease_seconds, "max_attempts": queue.max_attempts}
        ),
        "queue": services.queue_state(queue, viewer=request.user),
        "topics": "admin" if access.can(request.user, "see_cluster") else f"user.{request.user.pk}",
    }
    return render(request, "jobs/job_list.html", context)


@login_required
def job_detail(request, pk):
    related = services.visible_to(request.user).select_related("submitter", "parent", "retry_of")
    job = _visible_job(request.user, pk, related)
    context = {
        "job": job,
        "log": list(services.log_visible_to(request.user, job).order_by("id")[:2000]),
        "children": job.children.order_by("id").only("id", "opcode", "status"),
        "dependencies": job.dependencies.select_related("on").order_by("id"),
        "retries": job.retries.order_by("id").only("id", "status"),
        "may_retry": job.status in (Job.Status.ERROR, Job.Status.CANCELED)
        and registry.may_submit(request.user, job.opcode),
    }
    return render(request, "jobs/job_detail.html", context)


@login_required
@require_POST
def job_submit(request):
    form = JobSubmitForm(request.POST, user=request.user)
    if not form.is_valid():
        for field, errs in form.errors.items():
            messages.error(request, f"{field}: {' '.join(errs)}")
        return redirect("jobs:job-list")
    data = form.cleaned_data
    try:
        job = services.submit(
            data["opcode"],
            data["params"],
            actor=request.user,
            reason=data["reason"] or None,
            source=f"web:{request.user.get_username()}",
            priority=data["priority"],
            capped=True,
        )
    except serializers.ValidationError as exc:
        for line in _errors(exc):
            messages.error(request, line)
        return redirect("jobs:job-list")
    messages.success(request, f"Job {job.pk} submitted.")
    return redirect("jobs:job-detail", pk=job.pk)


@login_required
@require_POST
def job_cancel(request, pk):
    job = _visible_job(request.user, pk)
    form = JobActionForm(request.POST)
    reason = form.cleaned_data["reason"] if form.is_valid() else ""
    try:
        services.cancel(job, actor=request.user, reason=reason)
        messages.success(request, f"Cancel of job {job.pk} requested.")
    except services.Conflict as exc:
        messages.error(request, str(exc))
    return redirect("jobs:job-detail", pk=job.pk)


@login_required
@require_POST
def job_retry(request, pk):
    job = _visible_job(request.user, pk)
    if not registry.may_submit(request.user, job.opcode):
        raise PermissionDenied
    form = JobActionForm(request.POST)
    reason = form.cleaned_data["reason"] if form.is_valid() else ""
    try:
        new = services.retry(job, actor=request.user, reason=reason, capped=True)
    except (services.Conflict, serializers.ValidationError) as exc:
        messages.error(request, str(exc) if isinstance(exc, services.Conflict) else "; ".join(_errors(exc)))
        return redirect("jobs:job-detail", pk=job.pk)
    messages.success(request, f"Job {job.pk} retried as job {new.pk}.")
    return redirect("jobs:job-detail", pk=new.pk)


@login_required
@require_POST
def queue_update(request):
    if not access.can(request.user, "operate"):
        raise PermissionDenied
    form = QueueForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        services.set_queue_settings(
            actor=request.user,
            limit=data["limit"],
            lease_seconds=data["lease_seconds"],
            max_attempts=data["max_attempts"],
            reason=data["reason"],
        )
        messages.success(request, f"Queue: at most {data['limit']} jobs at once.")
    else:
        for field, errs in form.errors.items():
            messages.error(request, f"{field}: {' '.join(errs)}")
    return redirect("jobs:job-list")
