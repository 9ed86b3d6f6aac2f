"""Inventory pages for operators (and auditors, reading): hypervisor list, host page, blade centers as chassis."""

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db.models import Count
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from accounts.access import operator_page
from core import changelog
from inventory import services
from inventory.api.filters import HypervisorFilterSet
from inventory.forms import ScheduleForm, StateForm
from inventory.models import BladeCenter, Hypervisor


@operator_page
def hypervisor_list(request):
    queryset = Hypervisor.objects.select_related("group", "blade_center").prefetch_related("tags")
    filterset = HypervisorFilterSet(request.GET or None, queryset=queryset)
    hosts = filterset.qs if filterset.is_bound and filterset.is_valid() else queryset
    page = Paginator(hosts.order_by("name"), 100).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    counts = dict(Hypervisor.objects.values_list("state").annotate(n=Count("id")).order_by())
    return render(
        request,
        "inventory/hypervisor_list.html",
        {
            "filterset": filterset,
            "page": page,
            "query": query.urlencode(),
            "counts": counts,
        },
    )


@operator_page
def hypervisor_detail(request, pk):
    host = get_object_or_404(Hypervisor.objects.select_related("group", "blade_center", "credential"), pk=pk)
    return render(
        request,
        "inventory/hypervisor_detail.html",
        {
            "host": host,
            "tags": sorted(t.name for t in host.tags.all()),
            "state_form": StateForm(initial={"state": host.state}),
            "changes": changelog.history(host),
        },
    )


@operator_page
@require_POST
def hypervisor_state(request, pk):
    host = get_object_or_404(Hypervisor, pk=pk)
    form = StateForm(request.POST)
    if form.is_valid():
        try:
            changed = services.set_state(
                host, form.cleaned_data["state"], form.cleaned_data["reason"], actor=request.user
            )
        except ValidationError as exc:
            messages.error(request, "; ".join(exc.messages))
        else:
            messages.success(request, f"{host.name} is now {host.state}." if changed else "Nothing changed.")
    else:
        messages.error(request, "; ".join(f"{k}: {', '.join(v)}" for k, v in form.errors.items()))
    return redirect("inventory:hypervisor", pk=pk)


@operator_page
@require_POST
def hypervisor_schedule(request, pk):
    """Schedule drained/offline for when the host's current reservations end."""
    host = get_object_or_404(Hypervisor, pk=pk)
    form = ScheduleForm(request.POST)
    try:
        if not form.is_valid():
            raise ValidationError(form.errors)
        host = services.schedule_state(
            host, form.cleaned_data["state"], form.cleaned_data["reason"], actor=request.user
        )
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    else:
        when = f"{timezone.localtime(host.scheduled_until):%Y-%m-%d %H:%M %Z}"
        messages.success(request, f"{host.name} goes {host.scheduled_state} when its reservations end (by {when}).")
    return redirect("inventory:hypervisor", pk=pk)


@operator_page
@require_POST
def hypervisor_schedule_cancel(request, pk):
    host = get_object_or_404(Hypervisor, pk=pk)
    changed = services.cancel_schedule(host, "canceled in the web UI", actor=request.user)
    messages.success(request, "Scheduled change canceled." if changed else "Nothing was scheduled.")
    return redirect("inventory:hypervisor", pk=pk)


@operator_page
def blade_center_list(request):
    chassis = BladeCenter.objects.annotate(hosts=Count("hypervisors")).order_by("name")
    return render(request, "inventory/bladecenter_list.html", {"chassis_list": chassis})


@operator_page
def blade_center_detail(request, pk):
    chassis = get_object_or_404(BladeCenter, pk=pk)
    return render(
        request,
        "inventory/bladecenter_detail.html",
        {
            "chassis": chassis,
            "slots": services.chassis_slots(chassis),
            "changes": changelog.history(chassis),
        },
    )
