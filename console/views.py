"""The console page and its tickets. Thin: the checks and tickets are ``console.services``."""

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_POST

from console import services
from drivers.base import DriverError
from provisioning.models import VM

MAX_ID = 2**63 - 1


def _vm(request, pk):
    if pk > MAX_ID:
        raise Http404
    vm = get_object_or_404(VM.objects.select_related("host", "host__credential", "owner", "image"), pk=pk)
    if not services.may_open(request.user, vm):
        raise PermissionDenied("only the VM's owner and staff may open its console")
    return vm


@login_required
def console_page(request, pk):
    vm = _vm(request, pk)
    return render(request, "console/console.html", {"vm": vm, "unavailable": services.unavailable_reason(vm)})


@login_required
@require_POST
def ticket(request, pk):
    """A one-time ticket for one console websocket (``kind``: vnc or serial), and its URL."""
    vm = _vm(request, pk)
    kind = request.POST.get("kind", "")
    if kind not in services.KINDS:
        return JsonResponse({"error": f"kind: one of {', '.join(services.KINDS)}"}, status=400)
    reason = services.unavailable_reason(vm)
    if reason is None and kind == "vnc":
        try:
            services.vnc_address(vm)  # say now why there is no screen (noVNC cannot show a close reason)
        except DriverError as exc:
            reason = services.console_error(exc)
    if reason:
        return JsonResponse({"error": reason}, status=409)
    clear = services.issue(request.user, vm, kind)
    return JsonResponse({"url": f"/ws/console/{vm.pk}/{kind}/?ticket={clear}", "kind": kind})
