"""Staff pages of move plans: the list (with a form that computes one), a plan's moves and its
before/after utilisation chart, execute and cancel buttons; progress streams on ``plan.<id>``."""

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from accounts.access import operator_page
from core.errors import Conflict
from inventory.models import NodeGroup
from provisioning import plans
from provisioning.models import Plan


@operator_page
def plan_list(request):
    context = {"plans": Plan.objects.all()[:100], "kinds": Plan.Kind.choices, "groups": NodeGroup.objects.all()}
    return render(request, "vms/plan_list.html", context)


@operator_page
@require_POST
def plan_create(request):
    data = request.POST
    try:
        plan = plans.compute(
            data.get("kind", ""),
            actor=request.user,
            target=data.get("target", "").strip(),
            group=data.get("group") or None,
            reason=data.get("reason", "").strip(),
        )
    except Conflict as exc:
        messages.error(request, str(exc))
        return redirect("vms:plans")
    return redirect("vms:plan", plan.pk)


@operator_page
def plan_detail(request, pk):
    plan = plans.refresh(get_object_or_404(Plan, pk=pk))
    return render(request, "vms/plan_detail.html", {"plan": plan})


@operator_page
@require_POST
def plan_action(request, pk):
    plan = get_object_or_404(Plan, pk=pk)
    try:
        if request.POST.get("action") == "cancel":
            plans.cancel(plan, actor=request.user)
            messages.success(request, f"Plan {plan.pk} canceled.")
        else:
            plans.execute(plan, actor=request.user, recompute=request.POST.get("recompute") == "1")
            messages.success(request, f"Plan {plan.pk} is executing.")
    except Conflict as exc:
        messages.error(request, str(exc))
    return redirect("vms:plan", plan.pk)
