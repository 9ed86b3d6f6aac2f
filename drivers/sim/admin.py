"""Admin for the simulator: see hosts and VMs, inject and clear faults.

Faults are written through ``services.set_fault`` / ``clear_fault`` so the change log says
who injected what and why.
"""

from django import forms
from django.contrib import admin

from drivers.sim import services
from drivers.sim.models import SimExecProfile, SimFault, SimHost, SimImage, SimNetwork, SimNIC, SimVM


class SimFaultInline(admin.TabularInline):
    model = SimFault
    extra = 0
    fields = ["step", "mode", "seconds", "created"]
    readonly_fields = ["step", "mode", "seconds", "created"]
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(SimHost)
class SimHostAdmin(admin.ModelAdmin):
    list_display = ["name", "cpus", "memory_mib", "disk_gib", "dhcp_pool", "vm_count"]
    search_fields = ["name"]
    inlines = [SimFaultInline]

    def get_readonly_fields(self, request, obj=None):
        return ["name"] if obj else []

    @admin.display(description="VMs")
    def vm_count(self, obj):
        return obj.vms.count()

    def save_model(self, request, obj, form, change):
        saved = services.ensure_host(
            obj.name,
            cpus=obj.cpus,
            memory_mib=obj.memory_mib,
            disk_gib=obj.disk_gib,
            dhcp_pool=obj.dhcp_pool,
            actor=request.user,
            reason="admin",
        )
        obj.pk = saved.pk


class SimFaultForm(forms.ModelForm):
    class Meta:
        model = SimFault
        fields = ["host", "step", "mode", "seconds"]

    def clean(self):
        data = super().clean()
        if data.get("mode") == SimFault.Mode.SLOW and data.get("seconds") is None:
            self.add_error("seconds", "a slow fault needs seconds")
        return data

    def validate_unique(self):
        """Setting a fault on a step that has one replaces it (like ``set_fault``)."""


@admin.register(SimFault)
class SimFaultAdmin(admin.ModelAdmin):
    form = SimFaultForm
    list_display = ["host", "step", "mode", "seconds", "created"]
    list_filter = ["mode", "step"]
    search_fields = ["host__name"]
    actions = ["clear_selected"]

    def get_readonly_fields(self, request, obj=None):
        return ["host", "step"] if obj else []

    def save_model(self, request, obj, form, change):
        saved = services.set_fault(obj.host, obj.step, obj.mode, obj.seconds, actor=request.user, reason="admin")
        obj.pk = saved.pk

    def delete_model(self, request, obj):
        services.clear_fault(obj.host, obj.step, actor=request.user, reason="admin")

    def delete_queryset(self, request, queryset):
        for fault in queryset.select_related("host"):
            self.delete_model(request, fault)

    @admin.action(description="Clear the selected faults")
    def clear_selected(self, request, queryset):
        self.delete_queryset(request, queryset)


@admin.register(SimVM)
class SimVMAdmin(admin.ModelAdmin):
    """Read-only: VM state changes only through the driver (so jobs stay the truth)."""

    list_display = ["key", "host", "state", "vcpus", "memory_mib", "disk_gib", "address", "updated"]
    list_filter = ["state", "host"]
    search_fields = ["key", "address"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(SimImage)
class SimImageAdmin(admin.ModelAdmin):
    list_display = ["name", "host", "format", "size_gib", "captured_from", "created"]
    list_filter = ["host", "format"]
    search_fields = ["name", "location"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class SimNICInline(admin.TabularInline):
    model = SimNIC
    extra = 0
    fields = ["vm", "mac", "address"]
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(SimNetwork)
class SimNetworkAdmin(admin.ModelAdmin):
    """Read-only: networks are made and deleted by the driver (a network's members hold it)."""

    list_display = ["key", "host", "cidr", "created"]
    list_filter = ["host"]
    search_fields = ["key"]
    inlines = [SimNICInline]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(SimExecProfile)
class SimExecProfileAdmin(admin.ModelAdmin):
    """What commands "run" in simulated guests of an image give back (never run for real)."""

    list_display = ["image", "exit_status", "seconds", "repeat"]
    search_fields = ["image"]
