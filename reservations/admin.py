"""Admin for reservations and block allocations (quota rules: the VM app's admin).

Reservations and blocks are read-only here: their lifecycle goes through ``reservations.services``
(claims, jobs, history, events), which a plain admin save would bypass. The one-time password is
never shown, only whether one is set.
"""

from django.contrib import admin

from reservations.models import ApprovalRequest, BlockAllocation, IdlePolicy, Reservation, ReservationHistory


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ReservationHistoryInline(admin.TabularInline):
    model = ReservationHistory
    fields = ["at", "status", "reason"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Reservation)
class ReservationAdmin(ReadOnlyAdmin):
    list_display = ["__str__", "user", "image", "status", "start", "end", "vm", "block"]
    list_filter = [
        "status",
        "image",
        "start",
        ("block", admin.EmptyFieldListFilter),
        ("template_of", admin.EmptyFieldListFilter),
    ]
    search_fields = ["user__username", "image__name", "connect_user"]
    date_hierarchy = "start"
    list_select_related = ["user", "image", "vm"]
    exclude = ["connect_secret"]
    readonly_fields = ["password"]
    inlines = [ReservationHistoryInline]

    @admin.display(description="one-time password")
    def password(self, obj):
        return "set (encrypted)" if obj.connect_secret else "—"


@admin.register(BlockAllocation)
class BlockAllocationAdmin(ReadOnlyAdmin):
    list_display = ["name", "image", "group", "seats", "weeks", "start", "end", "canceled", "created_by"]
    list_filter = ["canceled", "image", "group"]
    search_fields = ["name"]
    list_select_related = ["image", "group", "created_by"]


@admin.register(IdlePolicy)
class IdlePolicyAdmin(admin.ModelAdmin):
    """Idle reclamation per image or group (a setting, like quota rules; read at each ready)."""

    list_display = ["__str__", "image", "group", "no_show_minutes", "idle_minutes", "warn_minutes"]
    list_filter = ["group", "image"]


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyAdmin):
    """Read-only: requests are decided on the approvals page or through the API (the decision
    makes the reservation or class, which a plain save would not)."""

    list_display = ["pk", "kind", "summary", "requester", "status", "expires_at", "decided_by"]
    list_filter = ["status", "kind"]
    search_fields = ["summary", "requester__username"]
