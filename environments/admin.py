"""Admin for environment templates: their fields and sharing written through the services
(change log, the images' permission rules); members and networks are shown, and written through
the API or ``manage.py environment``, where the rules that span them are checked together."""

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError

from environments import services
from environments.models import EnvironmentTemplate, Member, Network


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class MemberInline(ReadOnlyInline):
    model = Member
    fields = ["name", "image", "revision", "count", "vcpus", "memory_mib", "disk_gib", "entry", "networks"]
    readonly_fields = fields


class NetworkInline(ReadOnlyInline):
    model = Network
    fields = ["name", "cidr"]
    readonly_fields = fields


class TemplateForm(forms.ModelForm):
    class Meta:
        model = EnvironmentTemplate
        fields = ["name", "description", "visibility", "groups", "active"]

    def clean(self):
        """The audience's refusal as the form's error, before ``save_model`` writes anything."""
        data = super().clean()
        if self.instance.pk and {"groups", "visibility"} & set(self.changed_data):
            public = data.get("visibility") == EnvironmentTemplate.Visibility.PUBLIC
            try:
                services.check_audience(self.instance, public=public, groups=list(data.get("groups") or ()))
            except ValidationError as exc:
                raise ValidationError(exc.messages) from None  # keyed by members: no field of this form
        return data


@admin.register(EnvironmentTemplate)
class EnvironmentTemplateAdmin(admin.ModelAdmin):
    form = TemplateForm
    list_display = ["name", "owner", "visibility", "active", "updated"]
    list_filter = ["visibility", "active"]
    search_fields = ["name", "description", "owner__username"]
    fields = ["name", "description", "owner", "visibility", "groups", "active"]
    readonly_fields = ["owner"]
    filter_horizontal = ["groups"]
    inlines = [NetworkInline, MemberInline]

    def has_add_permission(self, request):
        return False  # a template is written with its members: the API, the CLI

    def save_model(self, request, obj, form, change):
        obj = EnvironmentTemplate.objects.get(pk=obj.pk)  # as stored: the change log diffs against it
        fields = {name: form.cleaned_data[name] for name in services.FIELDS if name in form.changed_data}
        visibility = fields.pop("visibility", None)
        if "groups" in form.changed_data:
            services.share_template(obj, list(form.cleaned_data["groups"]), actor=request.user, reason="admin")
        if visibility is not None:
            fields["visibility"] = visibility
        services.update_template(obj, actor=request.user, reason="admin", **fields)

    def save_related(self, request, form, formsets, change):
        # groups: shared in save_model (not form.save_m2m); the inlines are read-only, saved
        # only so that the admin's change message can read them
        for formset in formsets:
            self.save_formset(request, form, formset, change=change)

    def delete_model(self, request, obj):
        services.delete_template(obj, actor=request.user, reason="admin")

    def delete_queryset(self, request, queryset):
        for template in queryset:
            services.delete_template(template, actor=request.user, reason="admin")
