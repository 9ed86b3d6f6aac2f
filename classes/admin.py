"""Classes in the admin: to look at. Writes go through the course page, the API or the CLI
(``classes.services``), which claim and release the sessions' seats."""

from django.contrib import admin

from classes.models import BudgetGrant, Class, Meeting, NoSessionDay, WeeklySession


class ReadOnly:
    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class SessionInline(ReadOnly, admin.TabularInline):
    model = WeeklySession
    extra = 0


class NoSessionInline(ReadOnly, admin.TabularInline):
    model = NoSessionDay
    extra = 0


class MeetingInline(ReadOnly, admin.TabularInline):
    model = Meeting
    extra = 0
    fields = ["start", "end", "block"]


class GrantInline(ReadOnly, admin.TabularInline):
    model = BudgetGrant
    extra = 0
    fields = ["student", "hours", "reason", "granted_by", "at"]
    readonly_fields = ["at"]


@admin.register(Class)
class ClassAdmin(ReadOnly, admin.ModelAdmin):
    list_display = ["name", "course", "image", "first_day", "last_day", "time_zone", "hours_budget", "problem"]
    list_filter = ["course"]
    search_fields = ["name", "course__name"]
    inlines = [SessionInline, NoSessionInline, MeetingInline, GrantInline]
