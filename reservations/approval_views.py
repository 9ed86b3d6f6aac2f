"""The approvals pages: the queue of requests an approver may decide (approve or deny, with a
reason), and each request's page, where its requester sees it wait (and may withdraw it).
Thin: reads through ``approvals.visible`` / ``decidable``, writes through the services.
A request that is not yours to read is a 404; deciding one you may not, a 403."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from accounts import access
from core.errors import Conflict
from reservations import approvals, services
from reservations.models import ApprovalRequest

MAX_ID = 2**63 - 1
DECIDED_SHOWN = 50


@login_required
def queue(request):
    """Approvers: what waits for them, and what was decided lately; everyone: their own requests."""
    user = request.user
    deciding = access.is_admin(user) or access.can(user, "approve")
    waiting = services.decidable(user).select_related("requester", "image").order_by("expires_at") if deciding else []
    decided = []
    if deciding:
        seen = approvals.visible(user).exclude(status=ApprovalRequest.Status.PENDING).exclude(requester=user)
        decided = seen.select_related("requester", "image", "decided_by")[:DECIDED_SHOWN]
    mine = ApprovalRequest.objects.filter(requester=user).select_related("image")[:DECIDED_SHOWN]
    context = {"deciding": deciding, "waiting": waiting, "decided": decided, "mine": mine}
    return render(request, "reservations/approvals.html", context)


@login_required
def detail(request, pk):
    readable = approvals.visible(request.user).select_related("requester", "image", "decided_by")
    approval = get_object_or_404(readable, pk=min(pk, MAX_ID))
    context = {"approval": approval, "may_decide": approval.pending and approvals.may_decide(request.user, approval)}
    return render(request, "reservations/approval_detail.html", context)


@login_required
@require_POST
def decide(request, pk):
    """``decision``: approve, deny (a reason required) or withdraw (the requester)."""
    approval = get_object_or_404(approvals.visible(request.user), pk=min(pk, MAX_ID))
    verb = request.POST.get("decision")
    reason = request.POST.get("reason", "")[:500]
    try:
        if verb == "approve":
            approval = services.approve(approval, actor=request.user, reason=reason)
        elif verb == "deny":
            approval = services.deny(approval, actor=request.user, reason=reason)
        elif verb == "withdraw":
            approval = services.withdraw(approval, actor=request.user)
        else:
            raise ValidationError({"decision": ["approve, deny or withdraw"]})
    except PermissionDenied:
        raise
    except (ValidationError, Conflict) as exc:
        messages.error(request, "; ".join(getattr(exc, "messages", [str(exc)])))
        return redirect("reservations:approval", pk=approval.pk)
    messages.success(request, f"Request #{approval.pk}: {approval.get_status_display()}.")
    if verb == "withdraw":
        return redirect("reservations:approval", pk=approval.pk)
    return redirect("reservations:approvals")
