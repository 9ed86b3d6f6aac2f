"""Admin for the inventory. Every save, delete and state change goes through the services,
so the admin writes the same change log and events as the API and the CLI."""

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from import_export.admin import ImportExportModelAdmin

from accounts import access
from core import changelog
from inventory import admin_formats, services
from inventory.discovery.admin import discover_view
from inventory.forms import (
    BladeCenterRegistrationForm,
    CredentialAdminForm,
    HypervisorImportForm,
    StateActionForm,
)
from inventory.models import BladeCenter, Credential, Hypervisor, NodeGroup
from inventory.resources import HypervisorResource


def change_log_table(obj):
    """The object's change log as an HTML table (newest first)."""
    if obj is None or obj.pk is None:
        return "—"
    rows = [
        (
            f"{change.time:%Y-%m-%d %H:%M:%S}",
            change.actor,
            change.get_action_display(),
            ", ".join(
                f"{k}: {v[0]!r} → {v[1]!r}" if isinstance(v, list) and len(v) == 2 else k
                for k, v in change.changes.items()
            )
            or "—",
            change.reason or "",
        )
        for change in changelog.history(obj, limit=50)
    ]
    if not rows:
        return "no changes recorded"
    body = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", rows)
    return format_html(
        "<table><tr><th>when</th><th>who</th><th>what</th><th>changes</th><th>why</th></tr>{}</table>", body
    )


class ServiceAdmin(admin.ModelAdmin):
    """Saves and deletes through ``create`` / ``update`` / ``delete`` service functions."""

    create = update = delete = None
    service_fields = ()
    readonly_fields = ("change_log",)

    @admin.display(description="change log")
    def change_log(self, obj):
        return change_log_table(obj)

    def service_values(self, form):
        return {name: form.cleaned_data[name] for name in self.service_fields if name in form.cleaned_data}

    def save_model(self, request, obj, form, change):
        values = self.service_values(form)
        if change:
            saved = type(self).update(type(obj).objects.get(pk=obj.pk), actor=request.user, **values)
        else:
            saved = type(self).create(actor=request.user, **values)
        obj.pk = saved.pk
        obj._state.adding = False

    def save_related(self, request, form, formsets, change):
        """The service already saved everything, tags included."""

    def delete_model(self, request, obj):
        type(self).delete(obj, actor=request.user, reason="deleted in the admin")

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            try:
                type(self).delete(obj, actor=request.user, reason="deleted in the admin")
            except services.InUse as exc:
                messages.error(request, str(exc))


@admin.register(Credential)
class CredentialAdmin(ServiceAdmin):
    form = CredentialAdminForm
    list_display = ("name", "username", "has_secret", "updated")
    search_fields = ("name", "username")
    service_fields = ("name", "username", "description")
    create = staticmethod(services.create_credential)
    update = staticmethod(services.update_credential)
    delete = staticmethod(services.delete_credential)

    @admin.display(boolean=True, description="secret stored")
    def has_secret(self, obj):
        return obj.has_secret

    def save_model(self, request, obj, form, change):
        values = self.service_values(form)
        secret = form.cleaned_data.get("secret") or None
        if form.cleaned_data.get("clear_secret"):
            secret = ""
        endpoints = form.cleaned_data.get("endpoints", "").split()
        if change:
            saved = services.update_credential(
                Credential.objects.get(pk=obj.pk), actor=request.user, secret=secret, endpoints=endpoints, **values
            )
        else:
            saved = services.create_credential(actor=request.user, secret=secret or "", endpoints=endpoints, **values)
        obj.pk = saved.pk
        obj._state.adding = False


@admin.register(NodeGroup)
class NodeGroupAdmin(ServiceAdmin):
    list_display = ("name", "alloc_policy", "placement_policy", "exclusive_storage", "host_count")
    list_filter = ("alloc_policy", "placement_policy", "exclusive_storage")
    search_fields = ("name",)
    service_fields = services.GROUP_FIELDS
    create = staticmethod(services.create_node_group)
    update = staticmethod(services.update_node_group)
    delete = staticmethod(services.delete_node_group)

    @admin.display(description="hypervisors")
    def host_count(self, obj):
        return obj.hypervisors.count()


@admin.register(BladeCenter)
class BladeCenterAdmin(ServiceAdmin):
    list_display = ("name", "site", "model", "slot_count", "occupied", "chassis_page")
    search_fields = ("name", "site", "model")
    service_fields = services.CHASSIS_FIELDS
    change_list_template = "inventory/admin/bladecenter_change_list.html"
    create = staticmethod(services.create_blade_center)
    update = staticmethod(services.update_blade_center)
    delete = staticmethod(services.delete_blade_center)

    @admin.display(description="hypervisors")
    def occupied(self, obj):
        return f"{obj.hypervisors.count()} / {obj.slot_count}"

    @admin.display(description="chassis")
    def chassis_page(self, obj):
        return format_html('<a href="{}">view slots</a>', reverse("inventory:bladecenter", args=[obj.pk]))

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change, **kwargs)

        class ChassisForm(form):
            def clean(self):
                cleaned = super().clean()
                if self.instance.pk and "slot_count" in cleaned:
                    probe = BladeCenter(pk=self.instance.pk, slot_count=cleaned["slot_count"])
                    for field, errors in services.blade_center_errors(probe).items():
                        self.add_error(field, errors)
                return cleaned

        return ChassisForm

    def get_urls(self):
        register = path(
            "register/", self.admin_site.admin_view(self.register_view), name="inventory_bladecenter_register"
        )
        return [register, *super().get_urls()]

    def register_view(self, request):
        """One form → preview (dry run) → confirm: the chassis and its hypervisors at once."""
        if not self.has_add_permission(request) or not access.is_admin(request.user):
            raise PermissionDenied
        form = BladeCenterRegistrationForm(request.POST or None)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "form": form,
            "title": "Register a blade center",
        }
        if request.method == "POST" and form.is_valid():
            confirm = "confirm" in request.POST
            try:
                registration = services.register_blade_center(form.spec(), actor=request.user, dry_run=not confirm)
            except ValidationError as exc:
                for field, errors in exc.message_dict.items():
                    form.add_error(field if field in form.fields else None, errors)
            else:
                if confirm and registration.report.committed:
                    chassis = registration.blade_center
                    messages.success(request, f"Registered {chassis.name} with {len(registration.hosts)} hypervisors.")
                    return redirect("inventory:bladecenter", chassis.pk)
                context.update(
                    registration=registration, preview=zip(registration.hosts, registration.report.rows, strict=False)
                )
        return TemplateResponse(request, "inventory/admin/register_bladecenter.html", context)


@admin.register(Hypervisor)
class HypervisorAdmin(ServiceAdmin, ImportExportModelAdmin):
    resource_classes = [HypervisorResource]
    import_formats = admin_formats.ADMIN_FORMATS
    export_formats = admin_formats.ADMIN_FORMATS
    import_form_class = HypervisorImportForm
    change_list_template = "inventory/admin/hypervisor_change_list.html"
    action_form = StateActionForm
    actions = ["drain", "set_offline", "set_online"]
    list_display = (
        "name",
        "state_badge",
        "group",
        "blade_center",
        "slot",
        "driver",
        "cpus",
        "memory_mib",
        "disk_gib",
        "tag_list",
    )
    list_filter = ("state", "driver", "group", "blade_center", ("tags__name", admin.AllValuesFieldListFilter))
    list_select_related = ("group", "blade_center")
    search_fields = ("name", "address", "state_reason")
    readonly_fields = (
        "hypervisor_type",
        "state",
        "state_reason",
        "state_changed_by",
        "state_changed_at",
        "facts",
        "facts_updated_at",
        "power_state",
        "power_state_at",
        "power_standby",
        "change_log",
    )
    fieldsets = (
        (None, {"fields": ("name", "address", "driver", "hypervisor_type", "uri", "credential", "tags")}),
        ("Driver options", {"fields": ("driver_options",)}),
        ("Placement", {"fields": ("blade_center", "slot", "group", "overlay")}),
        (
            "Capacity",
            {
                "fields": (
                    ("cpus", "memory_mib", "disk_gib"),
                    ("cpu_ratio", "memory_ratio", "disk_ratio"),
                    ("reserved_cpus", "reserved_memory_mib", "reserved_disk_gib"),
                    ("max_vms", "spindles"),
                    "devices",
                )
            },
        ),
        ("State", {"fields": ("state", "state_reason", "state_changed_by", "state_changed_at")}),
        (
            "BMC (Redfish power)",
            {
                "fields": (
                    "bmc_address",
                    "bmc_credential",
                    "bmc_system",
                    "bmc_verify_tls",
                    "bmc_allow_http",
                    ("power_state", "power_state_at", "power_standby"),
                )
            },
        ),
        ("Reported by the driver", {"fields": ("facts", "facts_updated_at"), "classes": ("collapse",)}),
        ("Change log", {"fields": ("change_log",)}),
    )
    service_fields = (*services.HOST_FIELDS, "tags")
    create = staticmethod(services.create_hypervisor)
    update = staticmethod(services.update_hypervisor)
    delete = staticmethod(services.delete_hypervisor)

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("tags")

    def service_values(self, form):
        values = super().service_values(form)
        if "driver_options" in values and values["driver_options"] in (None, ""):
            values["driver_options"] = {}  # an emptied box: no options of the host's own
        if "devices" in values and values["devices"] in (None, ""):
            values["devices"] = []  # an emptied box: no devices
        return values

    def get_urls(self):
        view = self.admin_site.admin_view(lambda request: discover_view(self, request))
        return [path("discover/", view, name="inventory_hypervisor_discover"), *super().get_urls()]

    def get_import_data_kwargs(self, **kwargs):
        return {**super().get_import_data_kwargs(**kwargs), "preview_cells": True}

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj):
        return format_html('<span class="badge {}" title="{}">{}</span>', obj.state, obj.state_reason, obj.state)

    @admin.display(description="tags")
    def tag_list(self, obj):
        return ", ".join(sorted(t.name for t in obj.tags.all()))

    def has_delete_permission(self, request, obj=None):
        # A host running VMs offers no delete at all (the service refuses it anyway).
        if obj is not None and services.in_use_reasons(obj):
            return False
        return super().has_delete_permission(request, obj)

    def _set_state(self, request, queryset, state):
        reason = request.POST.get("reason", "").strip()
        if not reason:
            messages.error(request, "Give a reason for the state change (the field next to the action).")
            return
        with transaction.atomic():
            changed = sum(services.set_state(hv, state, reason, actor=request.user) for hv in queryset)
        messages.success(request, f"{changed} hypervisor(s) now {state}.")

    @admin.action(description="Drain: take no new VMs")
    def drain(self, request, queryset):
        self._set_state(request, queryset, Hypervisor.State.DRAINED)

    @admin.action(description="Set offline: take nothing")
    def set_offline(self, request, queryset):
        self._set_state(request, queryset, Hypervisor.State.OFFLINE)

    @admin.action(description="Set online")
    def set_online(self, request, queryset):
        self._set_state(request, queryset, Hypervisor.State.ONLINE)
