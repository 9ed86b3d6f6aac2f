"""The admin's discovery page (Hypervisors › Discover): one form → preview → register.

Mounted by ``inventory.admin.HypervisorAdmin`` at ``discover/``; calls the same service as the
command and the API. The password field is never rendered back.
"""

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect
from django.template.response import TemplateResponse

from accounts import access
from inventory.discovery import services
from inventory.models import NodeGroup


class DiscoveryForm(forms.Form):
    driver = forms.ChoiceField(choices=[("vmware", "vCenter / ESXi"), ("libvirt", "libvirt")])
    uris = forms.CharField(
        label="URI(s)",
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="https://vcenter.example.org/sdk, or one libvirt URI per line (qemu+ssh://root@kvm01/system).",
    )
    username = forms.CharField(required=False)
    password = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Stored as a credential when you register.",
    )
    group = forms.ModelChoiceField(NodeGroup.objects.all(), required=False, to_field_name="name")

    def uri_list(self):
        return [line.strip() for line in self.cleaned_data["uris"].splitlines() if line.strip()]


def discover_view(model_admin, request):
    if not (access.is_admin(request.user) and model_admin.has_add_permission(request)):
        raise PermissionDenied
    form = DiscoveryForm(request.POST or None)
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "form": form,
        "title": "Discover hypervisors",
    }
    if request.method == "POST" and form.is_valid():
        commit = "confirm" in request.POST
        group = form.cleaned_data["group"]
        try:
            found = services.discover(
                form.cleaned_data["driver"],
                form.uri_list(),
                actor=request.user,
                username=form.cleaned_data["username"],
                password=form.cleaned_data["password"],
                group=group.name if group else None,
                commit=commit,
                reason="discovery in the admin",
            )
        except services.DiscoveryError as exc:
            form.add_error(None, f"discovery failed, nothing was written: {exc}")
        else:
            if found.committed:
                messages.success(request, f"Discovery: {found.report.summary()}.")
                return redirect("admin:inventory_hypervisor_changelist")
            context["result"] = found.as_dict()
    return TemplateResponse(request, "inventory/admin/discover_hypervisors.html", context)
