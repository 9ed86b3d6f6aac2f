from django.contrib import admin, messages
from rest_framework import serializers

from jobs import services
from jobs.models import Job, JobLog, QueueSettings


class JobLogInline(admin.TabularInline):
    model = JobLog
    fields = ["time", "level", "message"]
    readonly_fields = fields
    extra = 0
    max_num = 0
    can_delete = False
    ordering = ["id"]


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ["id", "opcode", "status", "priority", "submitter", "received", "started", "ended", "waiting_for"]
    list_filter = ["status", "opcode", "archived", "error_kind"]
    search_fields = ["=id", "opcode", "waiting_for", "error_message"]
    list_select_related = ["submitter"]
    readonly_fields = [f.name for f in Job._meta.fields]
    inlines = [JobLogInline]
    actions = ["cancel_jobs", "retry_jobs"]
    date_hierarchy = "received"

    def has_add_permission(self, request):
        return False  # submit through the API, the CLI or the jobs page: they validate

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return request.user.is_superuser and (obj is None or obj.is_final)

    @admin.action(description="Cancel selected jobs")
    def cancel_jobs(self, request, queryset):
        done = 0
        for job in queryset.exclude(status__in=Job.FINAL):
            try:
                services.cancel(job, actor=request.user, reason="admin")
                done += 1
            except services.Conflict as exc:
                self.message_user(request, str(exc), messages.WARNING)
        self.message_user(request, f"Cancel requested for {done} jobs.")

    @admin.action(description="Retry selected failed or canceled jobs")
    def retry_jobs(self, request, queryset):
        new = []
        for job in queryset.filter(status__in=[Job.Status.ERROR, Job.Status.CANCELED]):
            try:
                new.append(services.retry(job, actor=request.user, reason="admin").pk)
            except (services.Conflict, serializers.ValidationError) as exc:
                self.message_user(request, f"job {job.pk}: {exc}", messages.WARNING)
        self.message_user(request, f"Submitted {len(new)} retries: {', '.join(map(str, new)) or 'none'}.")


@admin.register(QueueSettings)
class QueueSettingsAdmin(admin.ModelAdmin):
    """The queue's tunables; saving takes effect at the next dispatch (no restart)."""

    list_display = ["limit", "lease_seconds", "max_attempts", "updated"]
    fields = ["limit", "lease_seconds", "max_attempts"]

    def has_add_permission(self, request):
        return not QueueSettings.objects.exists()

    def has_delete_permission(self, request, obj=None):
        return False

    def changelist_view(self, request, extra_context=None):
        QueueSettings.get()  # the one row exists once anyone looks
        return super().changelist_view(request, extra_context)

    def save_model(self, request, obj, form, change):
        # The form validated the bounds (model validators); the service logs who changed what.
        services.set_queue_settings(
            actor=request.user,
            limit=obj.limit,
            lease_seconds=obj.lease_seconds,
            max_attempts=obj.max_attempts,
            reason="admin",
        )
