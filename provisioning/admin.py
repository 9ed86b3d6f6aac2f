"""Admin for images, their revisions and variants, the host image cache, VMs and quota rules.

Images and variants are written through the services (change log). VMs are read-only here:
their state changes only through jobs, so the hypervisor and the database never disagree.
Quota rules are plain rows and edited here (the form runs the rule's own checks).
"""

from django import forms
from django.contrib import admin

from provisioning import revisions, services
from provisioning.forms import ImageTagsMixin, guest_password_field
from provisioning.models import VM, HostImage, Image, ImageRevision, ImageVariant, Plan, PrivateNetwork, QuotaRule


class ImageVariantInlineForm(forms.ModelForm):
    guest_password = guest_password_field("VMware guest operations: blank keeps the stored one.")

    class Meta:
        model = ImageVariant
        fields = list(services.VARIANT_FIELDS)

    def clean(self):
        data = super().clean()
        stored = self.instance.pk is not None and self.instance.has_guest_password
        if data.get("guest_username") and not (data.get("guest_password") or stored):
            self.add_error("guest_password", "a guest login needs both a user and a password")
        return data

    def save(self, commit=True):
        variant = super().save(commit=False)
        if not variant.guest_username:
            variant.set_guest_password("")
        elif self.cleaned_data.get("guest_password"):
            variant.set_guest_password(self.cleaned_data["guest_password"])
        if variant.revision_id is None:  # a variant added here joins the production revision
            variant.revision = revisions.production_for_variant(variant.image, actor="admin")
        if commit:
            variant.save()
        return variant


class ImageVariantInline(admin.TabularInline):
    model = ImageVariant
    form = ImageVariantInlineForm
    extra = 0
    fields = [
        "revision",
        "hypervisor_type",
        "format",
        "location",
        "checksum",
        "size_gib",
        *services.KERNEL_FIELDS,
        "guest_username",
        "guest_password",
        "has_guest_password",
    ]
    readonly_fields = ["revision", "has_guest_password"]

    @admin.display(boolean=True, description="guest password set")
    def has_guest_password(self, obj):
        return obj.has_guest_password


@admin.register(Image)
class ImageAdmin(admin.ModelAdmin):
    form = ImageTagsMixin
    list_display = [
        "name",
        "os",
        "platform",
        "visibility",
        "active",
        "parent",
        "revert_on_end",
        "pool_size",
        "warm_min",
        "warm_max",
        "anti_affinity",
        "max_concurrent",
        "requires_approval",
        "owner",
    ]
    list_filter = ["visibility", "active", "platform", "requires_approval"]
    search_fields = ["name", "os", "description"]
    filter_horizontal = ["groups"]
    inlines = [ImageVariantInline]

    def save_model(self, request, obj, form, change):
        fields = {name: form.cleaned_data[name] for name in services.IMAGE_FIELDS if name in form.cleaned_data}
        if change:
            services.update_image(obj, actor=request.user, reason="admin", **fields)
        else:
            saved = services.create_image(actor=request.user, reason="admin", **fields)
            obj.pk = saved.pk

    def delete_model(self, request, obj):
        services.delete_image(obj, actor=request.user, reason="admin")


@admin.register(ImageRevision)
class ImageRevisionAdmin(admin.ModelAdmin):
    """Read-only: revisions change through the image's page, the API or ``manage.py revision``."""

    list_display = ["image", "number", "state", "created_by", "created", "comment"]
    list_filter = ["state"]
    search_fields = ["image__name", "comment"]
    readonly_fields = [field.name for field in ImageRevision._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(HostImage)
class HostImageAdmin(admin.ModelAdmin):
    list_display = ["variant", "host", "state", "staged_at"]
    list_filter = ["state"]
    readonly_fields = ["host", "variant", "state", "location", "error", "staging_job", "started", "staged_at"]

    def has_add_permission(self, request):
        return False


@admin.register(VM)
class VMAdmin(admin.ModelAdmin):
    list_display = ["__str__", "owner", "image", "host", "state", "address", "created"]
    list_filter = ["state", "host"]
    search_fields = ["name", "address", "owner__username"]
    readonly_fields = [field.name for field in VM._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(PrivateNetwork)
class PrivateNetworkAdmin(admin.ModelAdmin):
    """An environment's networks: made and removed by its machines' builds and teardowns only."""

    list_display = ["key", "host", "cidr", "created", "removed"]
    list_filter = ["host"]
    search_fields = ["key"]
    readonly_fields = [field.name for field in PrivateNetwork._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(QuotaRule)
class QuotaRuleAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "group",
        "image",
        "max_duration_minutes",
        "max_per_user",
        "max_per_group",
        "max_vcpus",
        "max_memory_mib",
    ]
    list_filter = ["group", "image"]
    search_fields = ["name"]


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    """Read-only: plans are computed, executed and canceled through their page, API or CLI."""

    list_display = ["__str__", "state", "score_before", "score_after", "created", "created_by"]
    list_filter = ["kind", "state"]
    readonly_fields = [field.name for field in Plan._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
