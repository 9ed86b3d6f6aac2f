from django.contrib import admin

from runs.models import Run, RunFile


class RunFileInline(admin.TabularInline):
    model = RunFile
    fields = ["kind", "path", "size", "stored", "created"]
    readonly_fields = fields
    extra = 0
    can_delete = False


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    """Read-only: runs change through their services and jobs (cancel from the run's page)."""

    list_display = ["id", "owner", "image", "state", "exit_status", "priority", "created", "ended"]
    list_filter = ["state", "priority", "image"]
    search_fields = ["owner__username", "platform", "error"]
    exclude = ["env"]  # values may be secrets
    readonly_fields = [f.name for f in Run._meta.fields if f.name != "env"]
    inlines = [RunFileInline]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
