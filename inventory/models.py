"""Inventory: credentials, node groups, blade centers and the hypervisors in them.

A ``Hypervisor`` carries what placement needs (capacity, overcommit ratios, reserved
amounts, state, group policy, tags); loaders in provisioning turn these rows into the
placement core's plain data. Writes go through ``inventory.services``.
"""

from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models.functions import Lower
from taggit.managers import TaggableManager

from core import outbound
from drivers import registry as drivers
from inventory import crypto
from inventory.devices import validate_devices
from inventory.validators import (
    FIRST_SLOT,
    MAX_SLOTS,
    RATIO_DEFAULTS,
    minimum_validators,
    ratio_validators,
    uri_errors,
    validate_address,
    validate_bmc_address,
    validate_name,
)

ALLOW_HTTP_HELP = "Send the BMC credential over plain http:// (off: only over https://)."


class Credential(models.Model):
    """A login a driver uses to reach hypervisors; the secret is encrypted at rest.

    ``endpoints``: the origins (``https://bmc.example.org:443``) the secret was saved for. It is
    sent nowhere else: whoever may point a host's BMC address elsewhere cannot make it send the
    secret to their own listener. They change only with the secret given again.
    """

    name = models.CharField(max_length=100, unique=True, validators=[validate_name])
    username = models.CharField(max_length=150, blank=True)
    encrypted_secret = models.TextField(blank=True, editable=False)
    endpoints = models.JSONField(
        default=list,
        blank=True,
        help_text="Where the secret may be sent: origins such as https://bmc.example.org:443.",
    )
    description = models.TextField(blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    @property
    def has_secret(self):
        return bool(self.encrypted_secret)

    def set_secret(self, clear):
        self.encrypted_secret = crypto.encrypt(clear)

    def get_secret(self):
        """The clear secret, for a driver about to connect. Never show it to anyone."""
        return crypto.decrypt(self.encrypted_secret)

    def sends_to(self, url):
        """May this credential be sent to ``url``'s origin?"""
        try:
            return outbound.origin(url) in self.endpoints
        except ValueError:
            return False


class NodeGroup(models.Model):
    """A set of hypervisors with one allocation policy, like a Ganeti node group."""

    class AllocPolicy(models.TextChoices):
        PREFERRED = "preferred", "preferred"
        LAST_RESORT = "last_resort", "last resort"
        UNALLOCATABLE = "unallocatable", "unallocatable"

    class PlacementPolicy(models.TextChoices):
        BALANCED = "balanced", "balanced (spread, like hail)"
        PACK = "pack", "pack (fill hosts, like hsqueeze)"
        EXTERNAL = "external", "external (an IAllocator program, e.g. Ganeti's hail)"

    name = models.CharField(max_length=100, unique=True, validators=[validate_name])
    alloc_policy = models.CharField(max_length=20, choices=AllocPolicy.choices, default=AllocPolicy.PREFERRED)
    exclusive_storage = models.BooleanField(
        default=False, help_text="Each VM disk gets whole spindles of its own (Ganeti's exclusive storage)."
    )
    placement_policy = models.CharField(
        max_length=20, choices=PlacementPolicy.choices, default=PlacementPolicy.BALANCED
    )
    iallocator = models.CharField(
        max_length=50,
        blank=True,
        help_text="For the external policy: which IAllocator program, by its name in the IALLOCATORS "
        "setting (empty: DEFAULT_IALLOCATOR). Programs are named in settings, never here, so an "
        "inventory administrator cannot make workers run arbitrary commands.",
    )
    description = models.TextField(blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    def clean(self):
        programs = settings.IALLOCATORS
        if self.iallocator and self.iallocator not in programs:
            known = ", ".join(sorted(programs)) or "none are configured (setting IALLOCATORS)"
            raise ValidationError({"iallocator": f"unknown IAllocator {self.iallocator!r}; known: {known}"})
        if self.placement_policy == self.PlacementPolicy.EXTERNAL and not self.iallocator_command():
            raise ValidationError(
                {
                    "iallocator": "the external policy needs an IAllocator program: name one of the IALLOCATORS "
                    "setting, or set DEFAULT_IALLOCATOR"
                }
            )

    def iallocator_command(self) -> str | None:
        """The command line of this group's IAllocator program, if any."""
        return settings.IALLOCATORS.get(self.iallocator or settings.DEFAULT_IALLOCATOR)


class BladeCenter(models.Model):
    """A chassis with numbered slots (1..slot_count), each holding at most one hypervisor."""

    name = models.CharField(max_length=100, unique=True, validators=[validate_name])
    site = models.CharField(max_length=100, blank=True, help_text="Site, room or rack.")
    model = models.CharField(max_length=100, blank=True)
    slot_count = models.PositiveSmallIntegerField(
        default=16, validators=[MinValueValidator(FIRST_SLOT), MaxValueValidator(MAX_SLOTS)]
    )
    management_address = models.CharField(max_length=253, blank=True, validators=[validate_address])
    # One Redfish service for the whole chassis; each blade is a System in it (its host's bmc_system).
    bmc_address = models.CharField(
        max_length=500,
        blank=True,
        validators=[validate_bmc_address],
        help_text="Redfish service of the chassis (https://…); its blades use it unless they have their own.",
    )
    bmc_credential = models.ForeignKey(
        Credential, null=True, blank=True, on_delete=models.PROTECT, related_name="bmc_blade_centers"
    )
    bmc_verify_tls = models.BooleanField(default=True, help_text="Check the BMC's TLS certificate.")
    bmc_allow_http = models.BooleanField(default=False, help_text=ALLOW_HTTP_HELP)
    notes = models.TextField(blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class Hypervisor(models.Model):
    """One virtualization host.

    Capacity usable by VMs is ``(cpus - reserved_cpus) * cpu_ratio`` vCPUs,
    ``(memory_mib - reserved_memory_mib) * memory_ratio`` MiB and
    ``(disk_gib - reserved_disk_gib) * disk_ratio`` GiB. ``reserved_cpus`` defaults to 0;
    set it to 1 to mirror Ganeti's vCPU kept for the node OS.
    """

    # The driver kinds of drivers/registry.py (Driver.SIM, Driver.LIBVIRT, ...).
    Driver = models.TextChoices("Driver", [(name.upper(), (name, label)) for name, label in drivers.DRIVER_CHOICES])

    class State(models.TextChoices):
        ONLINE = "online", "online"
        DRAINED = "drained", "drained (takes no new VMs)"
        OFFLINE = "offline", "offline (takes nothing)"

    class PowerState(models.TextChoices):
        ON = "on", "on"
        OFF = "off", "off"
        UNKNOWN = "unknown", "unknown"

    # Hypervisor type per driver, and the image formats it runs (None: any, emulated).
    HV_TYPES = drivers.HV_TYPES
    IMAGE_FORMATS = drivers.IMAGE_FORMATS
    HV_LABELS = dict(drivers.HV_TYPE_CHOICES)  # hypervisor type → its words ("simulated")
    # The types whose hosts run an image with variants of the given types (the registry's rule).
    serving_types = staticmethod(drivers.serving_types)

    name = models.CharField(max_length=100, validators=[validate_name])
    address = models.CharField(max_length=253, validators=[validate_address], help_text="IP address or host name.")
    driver = models.CharField(max_length=20, choices=Driver.choices, default=Driver.SIM)
    uri = models.CharField(
        max_length=500,
        blank=True,
        help_text="Connection URI; blank derives one from the driver and address.",
    )
    credential = models.ForeignKey(
        Credential, null=True, blank=True, on_delete=models.PROTECT, related_name="hypervisors"
    )
    blade_center = models.ForeignKey(
        BladeCenter, null=True, blank=True, on_delete=models.PROTECT, related_name="hypervisors"
    )
    slot = models.PositiveSmallIntegerField(null=True, blank=True)
    group = models.ForeignKey(
        NodeGroup,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="hypervisors",
        help_text="Blank: the implicit default group (preferred, balanced).",
    )

    cpus = models.PositiveIntegerField(validators=minimum_validators("cpus"), help_text="Physical cores.")
    memory_mib = models.PositiveIntegerField(validators=minimum_validators("memory_mib"))
    disk_gib = models.PositiveIntegerField(validators=minimum_validators("disk_gib"))
    cpu_ratio = models.FloatField(default=RATIO_DEFAULTS["cpu_ratio"], validators=ratio_validators())
    memory_ratio = models.FloatField(default=RATIO_DEFAULTS["memory_ratio"], validators=ratio_validators())
    disk_ratio = models.FloatField(default=RATIO_DEFAULTS["disk_ratio"], validators=ratio_validators())
    reserved_cpus = models.PositiveIntegerField(default=0)
    reserved_memory_mib = models.PositiveIntegerField(default=0)
    reserved_disk_gib = models.PositiveIntegerField(default=0)
    max_vms = models.PositiveIntegerField(null=True, blank=True, help_text="Blank: no limit.")
    spindles = models.PositiveIntegerField(default=1)
    # The operator builds the overlay (a VXLAN zone, a switch fabric); vclmgr attaches to it.
    overlay = models.CharField(
        max_length=100,
        blank=True,
        validators=[validate_name],
        help_text="The overlay network the operator joined this host to (e.g. a VXLAN zone): hosts of one overlay "
        "can carry an environment's private network between them. Blank: none (each network stays on one host).",
    )

    state = models.CharField(max_length=10, choices=State.choices, default=State.ONLINE)
    state_reason = models.CharField(max_length=500, blank=True)
    state_changed_by = models.CharField(max_length=150, blank=True)
    state_changed_at = models.DateTimeField(null=True, blank=True)
    # A state change to make once its current reservations end (VCL's "after reservations").
    # From the moment it is scheduled the host takes nothing that outlasts ``scheduled_until``.
    scheduled_state = models.CharField(
        max_length=10,
        blank=True,
        choices=[(s, s) for s in ("drained", "offline")],
        help_text="Drained or offline once its current reservations end (blank: nothing scheduled).",
    )
    scheduled_reason = models.CharField(max_length=500, blank=True)
    scheduled_until = models.DateTimeField(
        null=True, blank=True, help_text="When its current reservations end: it takes nothing that lasts longer."
    )
    scheduled_by = models.CharField(max_length=150, blank=True)

    # The host's BMC (Redfish). Blank address: the blade center's, when it has one.
    bmc_address = models.CharField(
        max_length=500,
        blank=True,
        validators=[validate_bmc_address],
        help_text="Redfish service of this host's BMC (https://…); blank: its blade center's.",
    )
    bmc_credential = models.ForeignKey(
        Credential,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="bmc_hosts",
        help_text="Blank: the blade center's BMC credential.",
    )
    bmc_system = models.CharField(
        max_length=300,
        blank=True,
        help_text="Redfish System of this host: its id or /redfish/v1/Systems/… path; blank: the BMC's only one.",
    )
    bmc_verify_tls = models.BooleanField(default=True, help_text="Check the BMC's TLS certificate.")
    bmc_allow_http = models.BooleanField(default=False, help_text=ALLOW_HTTP_HELP)
    power_state = models.CharField(max_length=10, choices=PowerState.choices, default=PowerState.UNKNOWN)
    power_state_at = models.DateTimeField(null=True, blank=True, help_text="When the BMC last reported it.")
    power_standby = models.BooleanField(
        default=False, help_text="vclmgr powered it off: it may be powered on again when demand needs it."
    )

    tags = TaggableManager(blank=True)
    driver_options = models.JSONField(
        default=dict,
        blank=True,
        help_text='Options for this host\'s driver, over VCLMGR_DRIVER_OPTIONS (libvirt: {"domain_type": "qemu", '
        '"pool": "vms", "network": "default", "cpu_mode": "host-model"}).',
    )
    devices = models.JSONField(
        default=list,
        blank=True,
        validators=[validate_devices],
        help_text='GPUs and vGPU types placement counts, e.g. [{"kind": "gpu", "vendor": "nvidia", '
        '"model": "nvidia-a100", "count": 2}] (see inventory/devices.py); filled by the driver\'s facts '
        "when it reports devices.",
    )
    facts = models.JSONField(default=dict, blank=True, help_text="As last reported by the driver.")
    facts_updated_at = models.DateTimeField(null=True, blank=True, help_text="When the driver last reported.")

    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                Lower("name"),
                name="hypervisor_unique_name_ci",
                violation_error_message="a hypervisor with this name already exists (names ignore case)",
            ),
            models.UniqueConstraint(
                fields=["blade_center", "slot"],
                name="hypervisor_unique_slot",
                violation_error_message="this slot of the blade center is already taken",
            ),
        ]
        indexes = [
            models.Index(fields=["name"], name="hypervisor_name"),
            models.Index(fields=["state"], name="hypervisor_state"),
        ]

    def __str__(self):
        return self.name

    @property
    def hypervisor_type(self):
        return self.HV_TYPES.get(self.driver, self.driver)

    @property
    def image_formats(self):
        """Image formats this host can run; None means any (the simulator emulates them all)."""
        return self.IMAGE_FORMATS.get(self.hypervisor_type)

    @property
    def connection_uri(self):
        if self.uri:
            return self.uri
        return drivers.default_uri(self.driver, name=self.name, address=self.address)

    @property
    def usable_vcpus(self):
        return max(0, self.cpus - self.reserved_cpus) * self.cpu_ratio

    @property
    def usable_memory_mib(self):
        return max(0, self.memory_mib - self.reserved_memory_mib) * self.memory_ratio

    @property
    def usable_disk_gib(self):
        return max(0, self.disk_gib - self.reserved_disk_gib) * self.disk_ratio

    def bmc(self):
        """The BMC to power this host through (its own, else its blade center's), or None."""
        chassis = self.blade_center if self.blade_center_id else None
        own = bool(self.bmc_address)
        address = self.bmc_address or (chassis.bmc_address if chassis else "")
        if not address:
            return None
        credential = self.bmc_credential if self.bmc_credential_id else None
        if credential is None and chassis is not None and chassis.bmc_credential_id:
            credential = chassis.bmc_credential
        verify = self.bmc_verify_tls if own or chassis is None else chassis.bmc_verify_tls and self.bmc_verify_tls
        allow_http = self.bmc_allow_http if own or chassis is None else chassis.bmc_allow_http
        return BMC(
            address=address, credential=credential, system=self.bmc_system, verify_tls=verify, allow_http=allow_http
        )

    def clean(self):
        """Rules across fields; no queries beyond loading the chassis."""
        errors = cross_field_errors(self, self.blade_center if self.blade_center_id else None)
        if errors:
            raise ValidationError(errors)


@dataclass(frozen=True)
class BMC:
    """Where and as whom to reach a host's Redfish service (the secret stays in the credential)."""

    address: str
    credential: Credential | None
    system: str
    verify_tls: bool
    allow_http: bool = False


def cross_field_errors(hv, chassis):
    """{field: message} for rules spanning several fields (used by clean() and the import)."""
    errors = {}
    if hv.driver in Hypervisor.HV_TYPES:
        message = uri_errors(hv.uri, hv.driver)
        if message:
            errors["uri"] = message
        problems = drivers.host_options_errors(hv.driver, hv.driver_options, hv.connection_uri)
        if problems:
            errors["driver_options"] = "; ".join(f"{key} {text}".strip() for key, text in problems.items())
    if hv.overlay and hv.driver in Hypervisor.HV_TYPES and hv.driver not in drivers.OVERLAY_DRIVERS:
        errors["overlay"] = f"a {hv.driver} host cannot attach private networks to an overlay"
    if chassis is None and hv.slot is not None:
        errors["slot"] = "a slot needs a blade_center"
    elif chassis is not None and hv.slot is None:
        errors["slot"] = f"required: which slot of {chassis.name} ({FIRST_SLOT}–{chassis.slot_count})"
    elif chassis is not None and not FIRST_SLOT <= hv.slot <= chassis.slot_count:
        errors["slot"] = f"{chassis.name} has slots {FIRST_SLOT}–{chassis.slot_count}, not {hv.slot}"
    for resource, reserved in (
        ("cpus", "reserved_cpus"),
        ("memory_mib", "reserved_memory_mib"),
        ("disk_gib", "reserved_disk_gib"),
    ):
        total, kept = getattr(hv, resource), getattr(hv, reserved)
        if isinstance(total, int) and isinstance(kept, int) and kept > total and total > 0:
            errors[reserved] = f"cannot exceed {resource} ({total})"
    return errors
