"""Environment templates: several connected VMs reserved as one.

An ``EnvironmentTemplate`` names its ``Member`` rows (a hostname, an image — its production
revision, or one pinned by whoever maintains the image —, a size, how many:
``count`` > 1 makes ``name-1`` … ``name-N``) and its private ``Network`` rows (an IPv4 range the
members attached to it share). Exactly one member, of count 1, is the ``entry``: the machine
its user connects to. A template is shared like an image (``visibility``, ``groups``,
``owner``, ``active``: the rule is ``accounts.access.visible``). The rules that span rows (one
entry, ranges that do not overlap, hosts that fit their range) are ``environments.rules``,
checked by the services before anything is written.
"""

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from accounts import access

#: A hostname: one DNS label (RFC 1123), lower case.
DNS_LABEL = RegexValidator(
    r"^(?!-)[a-z0-9-]{1,63}(?<!-)\Z",
    "a hostname: 1 to 63 lower-case letters, digits and '-', not starting or ending with '-'",
)
#: The most VMs one member stands for (``name-1`` … ``name-N``).
MAX_COUNT = 64
#: The largest VM a member may ask for: the VM API's bounds (the image's minimums are the floor).
MAX_VCPUS = 1024
MAX_MEMORY_MIB = 16 * 1024 * 1024
MAX_DISK_GIB = 1024 * 1024


class TemplateQuerySet(models.QuerySet):
    def visible_to(self, user):
        """Templates ``user`` may use: the image rule (``access.visible``); their own inactive
        ones too, so that an owner who switches one off can switch it on again."""
        public = models.Q(visibility=EnvironmentTemplate.Visibility.PUBLIC)
        return access.visible(self, user, public, owner_sees_inactive=True)


class EnvironmentTemplate(models.Model):
    class Visibility(models.TextChoices):
        PUBLIC = "public", "public (every user)"
        RESTRICTED = "restricted", "restricted to groups"

    # unique per owner: a name taken by someone else's template (one the writer may not even
    # see) is never refused, so no refusal tells who has a template of that name
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="environment_templates",
        help_text="Who wrote it: they use, change and delete it.",
    )
    visibility = models.CharField(max_length=12, choices=Visibility.choices, default=Visibility.RESTRICTED)
    groups = models.ManyToManyField(
        "auth.Group", blank=True, related_name="environment_templates", help_text="Who may use a restricted template."
    )
    active = models.BooleanField(default=True, help_text="Inactive templates cannot be reserved.")
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    objects = TemplateQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "name"],
                name="environment_template_owner_name",
                violation_error_message="you have a template of this name already",
            )
        ]

    def __str__(self):
        return self.name


class Network(models.Model):
    """A private IPv4 network of the template (RFC 1918, /16 to /29); its first host address
    is the gateway, so it holds ``2**(32 - prefix) - 3`` machines."""

    template = models.ForeignKey(EnvironmentTemplate, on_delete=models.CASCADE, related_name="networks")
    name = models.CharField(max_length=63, validators=[DNS_LABEL])
    cidr = models.CharField("CIDR", max_length=18, help_text="e.g. 192.168.10.0/24 (blank: one is picked).")

    class Meta:
        ordering = ["template", "name"]
        constraints = [models.UniqueConstraint(fields=["template", "name"], name="environment_network_name")]

    def __str__(self):
        return f"{self.name} ({self.cidr})"


class Member(models.Model):
    template = models.ForeignKey(EnvironmentTemplate, on_delete=models.CASCADE, related_name="members")
    name = models.CharField(max_length=63, validators=[DNS_LABEL], help_text="Its hostname.")
    image = models.ForeignKey("vms.Image", on_delete=models.PROTECT, related_name="environment_members")
    revision = models.ForeignKey(
        "vms.ImageRevision",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="environment_members",
        help_text="The image's revision its machines are built from (one under test); blank: the production one.",
    )
    count = models.PositiveIntegerField(
        default=1,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_COUNT)],
        help_text="How many such machines (more than one: named name-1 … name-N).",
    )
    vcpus = models.PositiveIntegerField(validators=[MinValueValidator(1), MaxValueValidator(MAX_VCPUS)])
    memory_mib = models.PositiveIntegerField(validators=[MinValueValidator(16), MaxValueValidator(MAX_MEMORY_MIB)])
    disk_gib = models.PositiveIntegerField(validators=[MaxValueValidator(MAX_DISK_GIB)])
    entry = models.BooleanField(default=False, help_text="The machine its user connects to (exactly one, of count 1).")
    networks = models.ManyToManyField(Network, blank=True, related_name="members")

    class Meta:
        ordering = ["template", "name"]
        constraints = [models.UniqueConstraint(fields=["template", "name"], name="environment_member_name")]

    def __str__(self):
        return self.name

    def hostnames(self):
        return hostnames(self.name, self.count)


def hostnames(name, count):
    """The machines' hostnames of a member: its name alone, or ``name-1`` … ``name-N``."""
    return [name] if count == 1 else [f"{name}-{i}" for i in range(1, count + 1)]
