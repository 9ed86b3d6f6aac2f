"""Environment template pages: the templates a user may use, one template's machines and
networks. Thin: reads through ``services.visible_templates``, the delete through the service."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from core.errors import InUse
from environments import services


def _visible(user):
    return services.visible_templates(user).select_related("owner").prefetch_related("groups", "members__image")


@login_required
def template_list(request):
    templates = _visible(request.user).prefetch_related("networks").order_by("name")
    rows = [(t, sum(m.count for m in t.members.all())) for t in templates]
    return render(request, "environments/template_list.html", {"rows": rows})


@login_required
def template_detail(request, pk):
    template = get_object_or_404(_visible(request.user), pk=pk)
    machines = services.expand(template)
    context = {
        "template": template,
        "machines": machines,
        "hidden": services.hidden_images(request.user, machines),
        "networks": template.networks.prefetch_related("members").order_by("name"),
        "may_change": services.may_change(request.user, template),
    }
    return render(request, "environments/template_detail.html", context)


@login_required
@require_POST
def template_delete(request, pk):
    template = get_object_or_404(_visible(request.user), pk=pk)
    try:
        services.delete_template(template, actor=request.user, reason="deleted from its page")
    except (PermissionDenied, InUse) as exc:
        messages.error(request, str(exc))
        return redirect("environments:detail", pk=pk)
    messages.success(request, f"Environment template {template.name} deleted.")
    return redirect("environments:list")
