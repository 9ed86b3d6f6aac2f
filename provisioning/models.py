"""The image library, the host image cache and virtual machines.

An ``Image`` is what users pick. It has numbered ``ImageRevision`` rows (Apache VCL's model):
one is ``production`` (what new VMs are built from), the others are ``testing`` or ``retired``.
A revision has one ``ImageVariant`` per hypervisor type, because images are not portable
across hypervisors; a VM records the revision it was built from and keeps it. ``HostImage``
records which variant is cached on which host (staging it is done once per host, and
throttled). A ``VM`` is the database's view of one virtual machine; the hypervisor knows it by
``key`` (``vcl-<id>``). ``QuotaRule`` rows limit what the members of a group may hold at once
(reservations and VMs, ``quotas.py``).
"""

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.utils import timezone
from taggit.managers import TaggableManager

from accounts import access
from drivers import base
from drivers import registry as drivers
from drivers.base import FORMATS, vm_key
from inventory.devices import MODEL_RE

MAX_GPUS = 16  # the most GPUs one VM asks for (a reservation's too)
MAX_WARM = 100  # the most warm VMs one image's pool keeps
NAME_HELP = "Letters, digits, '.', '_' and '-' (becomes a file name on the hosts)."


class ImageQuerySet(models.QuerySet):
    def visible_to(self, user):
        """Images a user may use: all for staff; otherwise active public ones, their groups' and
        their own (``owner``: a capture is its owner's at once, no publishing needed). An image
        maintainer also sees their groups' images (inactive ones included) and the images their
        groups' members own, which they may share with those groups.
        (On the model so that layers below vms — capacity's plan — apply the same rule.)"""
        return access.visible(self, user, models.Q(visibility=Image.Visibility.PUBLIC))


class Image(models.Model):
    class Visibility(models.TextChoices):
        PUBLIC = "public", "public (every user)"
        RESTRICTED = "restricted", "restricted to groups"

    class Readiness(models.TextChoices):
        PORT = "port", "the login port answers"
        AGENT = "agent", "the guest agent answers (QEMU guest agent)"

    name = models.CharField(max_length=100, unique=True, help_text=NAME_HELP)
    os = models.CharField("OS", max_length=100, blank=True)
    platform = models.CharField(max_length=50, default="x86_64")
    description = models.TextField(blank=True)
    min_vcpus = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    min_memory_mib = models.PositiveIntegerField(default=512, validators=[MinValueValidator(16)])
    min_disk_gib = models.PositiveIntegerField(default=1)
    default_vcpus = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    default_memory_mib = models.PositiveIntegerField(default=1024, validators=[MinValueValidator(16)])
    default_disk_gib = models.PositiveIntegerField(default=10)
    default_gpus = models.PositiveSmallIntegerField(
        "default GPUs",
        default=0,
        validators=[MaxValueValidator(MAX_GPUS)],
        help_text="GPUs a reservation of it asks for unless it says otherwise (0: none).",
    )
    default_gpu_model = models.CharField(
        "default GPU model",
        max_length=100,
        blank=True,
        validators=[RegexValidator(MODEL_RE, "a model name is letters, digits, '.', '_' or '-'")],
        help_text="The GPU model of those (e.g. nvidia-a100-pcie-40gb); blank: whichever model a host has.",
    )
    visibility = models.CharField(max_length=12, choices=Visibility.choices, default=Visibility.PUBLIC)
    groups = models.ManyToManyField(
        "auth.Group", blank=True, related_name="images", help_text="Who may use a restricted image."
    )
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="derived")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="owned_images",
        help_text="Who captured it: they use it at once, rename or delete it while unused.",
    )
    revert_on_end = models.BooleanField(default=False, help_text="Revert to a snapshot instead of destroying.")
    pool_size = models.PositiveIntegerField(
        default=0,
        help_text="Batch runs: finished runs' VMs, reverted clean, kept per host for the next run (0: no pool; "
        "public images only).",
    )
    warm_min = models.PositiveIntegerField(
        default=0,
        validators=[MaxValueValidator(MAX_WARM)],
        help_text="Reservations: VMs kept booted, with no login, for the next reservations to take (0: no pool).",
    )
    warm_max = models.PositiveIntegerField(
        default=0,
        validators=[MaxValueValidator(MAX_WARM)],
        help_text="The most warm VMs the pool keeps (at least the minimum; 0: no pool).",
    )
    active = models.BooleanField(default=True, help_text="Inactive images cannot be used for new VMs.")
    user_data = models.TextField(
        blank=True,
        help_text="The image's own #cloud-config, merged into every VM's seed (it cannot change the user's login).",
    )
    required_tags = models.JSONField(
        default=list, blank=True, help_text="Host tags its VMs need (e.g. gpu): they go only to hosts with all of them."
    )
    forbidden_tags = models.JSONField(
        default=list, blank=True, help_text="Host tags its VMs avoid: never on a host with any of them."
    )
    anti_affinity = models.CharField(
        max_length=100,
        blank=True,
        help_text="A group name: two VMs of this group (of any image) never share a host at overlapping times.",
    )
    exclusive_storage = models.BooleanField(
        default=False, help_text="Its VMs go only to hosts of node groups with exclusive storage (own disks)."
    )
    ready_timeout = models.PositiveIntegerField(
        default=120,
        validators=[MinValueValidator(1)],
        help_text="Seconds a booted guest has to answer on its login port before the VM counts as failed.",
    )
    readiness = models.CharField(
        max_length=10,
        choices=Readiness.choices,
        default=Readiness.PORT,
        help_text="What makes a booted VM ready: its login port answers (SSH/RDP), or its guest agent does.",
    )
    max_concurrent = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Licence cap: reservations and VMs of this image at once, over all users (blank: no cap).",
    )
    on_host_failure = models.CharField(
        max_length=10,
        choices=[("rebuild", "rebuild on another host"), ("fail", "fail the reservation")],
        default="rebuild",
        help_text="When the host of a reservation's VM dies: rebuild it elsewhere from this image, or fail it.",
    )
    requires_approval = models.BooleanField(
        default=False,
        help_text="A reservation of it (or a class of it) waits for an approver before anything is claimed.",
    )
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    objects = ImageQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class ImageRevision(models.Model):
    """One numbered version of an image: its disks (``variants``), who made it, when, from
    which revision, why. At most one revision of an image is ``production``; making another
    one production is the roll-back (or forward), and the one it replaces becomes ``testing``
    (``provisioning.revisions``). ``retired``: kept for the VMs still built from it, never
    offered again unless made production."""

    class State(models.TextChoices):
        TESTING = "testing", "testing"
        PRODUCTION = "production", "production"
        RETIRED = "retired", "retired"

    image = models.ForeignKey(Image, on_delete=models.CASCADE, related_name="revisions")
    number = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    state = models.CharField(max_length=12, choices=State.choices, default=State.TESTING)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created = models.DateTimeField(default=timezone.now, editable=False)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children", help_text="Made from."
    )
    comment = models.TextField(blank=True)

    class Meta:
        ordering = ["image", "number"]
        constraints = [
            models.UniqueConstraint(fields=["image", "number"], name="imagerevision_number"),
            models.UniqueConstraint(
                fields=["image"], condition=models.Q(state="production"), name="imagerevision_one_production"
            ),
        ]

    def __str__(self):
        return f"{self.image.name} r{self.number} ({self.state})"


class ImageVariantQuerySet(models.QuerySet):
    def production(self):
        """The variants of their images' production revisions (what new VMs are built from)."""
        return self.filter(revision__state=ImageRevision.State.PRODUCTION)


class ImageVariant(models.Model):
    """A revision of the image in the form one hypervisor type runs (``sim`` runs any format).
    ``image`` is the revision's image, kept on the row so that image-level reads need no join."""

    HV_TYPES = drivers.HV_TYPE_CHOICES  # one per hypervisor type of the driver registry

    image = models.ForeignKey(Image, on_delete=models.CASCADE, related_name="variants")
    revision = models.ForeignKey(ImageRevision, on_delete=models.CASCADE, related_name="variants")
    hypervisor_type = models.CharField(max_length=20, choices=HV_TYPES)
    format = models.CharField(max_length=10, choices=[(f, f) for f in FORMATS])
    location = models.CharField(max_length=1000, help_text="Path, file:// or http(s):// URL, or template name.")
    checksum = models.CharField(max_length=200, blank=True, help_text="sha256:<hex> (blank: not verified).")
    size_gib = models.PositiveIntegerField(default=0)
    # Direct kernel boot (KVM, sim): the VM boots this kernel and initrd, staged with the disk,
    # with ``kernel_args``, instead of the disk's boot loader (``drivers.base.ImageVariantSpec``).
    kernel = models.CharField(
        max_length=1000, blank=True, help_text="Direct kernel boot: path, file:// or http(s):// URL of the kernel."
    )
    kernel_checksum = models.CharField(max_length=200, blank=True, help_text="sha256:<hex> (needed with a checksum).")
    initrd = models.CharField(max_length=1000, blank=True, help_text="Its initrd (optional), located like the kernel.")
    initrd_checksum = models.CharField(max_length=200, blank=True, help_text="sha256:<hex> (needed with a checksum).")
    kernel_args = models.CharField(
        max_length=base.KERNEL_ARGS_MAX, blank=True, help_text="The kernel command line (one printable line)."
    )
    # VMware guest operations (batch runs) log in to the guest as an account of the image (a
    # service account of the template); its password is encrypted like the hosts' credentials.
    guest_username = models.CharField(
        max_length=150, blank=True, help_text="VMware: the guest account batch runs log in as (guest operations)."
    )
    encrypted_guest_password = models.TextField(blank=True, editable=False)
    created = models.DateTimeField(auto_now_add=True)

    objects = ImageVariantQuerySet.as_manager()

    class Meta:
        ordering = ["image", "revision", "hypervisor_type"]
        constraints = [
            models.UniqueConstraint(fields=["revision", "hypervisor_type"], name="imagevariant_one_per_type"),
        ]

    def __str__(self):
        return f"{self.image.name} ({self.hypervisor_type}, {self.format})"

    @property
    def boots_kernel(self):
        return bool(self.kernel)

    def clean(self):
        super().clean()
        if self.kernel and self.hypervisor_type and self.hypervisor_type not in drivers.KERNEL_BOOT_TYPES:
            label = dict(self.HV_TYPES).get(self.hypervisor_type, self.hypervisor_type)
            raise ValidationError({"kernel": [f"{label} hosts cannot boot a kernel directly: boot the disk instead"]})

    @property
    def has_guest_password(self):
        return bool(self.encrypted_guest_password)

    def set_guest_password(self, clear):
        from inventory import crypto

        self.encrypted_guest_password = crypto.encrypt(clear)

    def guest_login(self):
        """``{"username", "password"}`` for a driver about to log in to the guest, or None. Never show it."""
        from inventory import crypto

        if not self.guest_username or not self.encrypted_guest_password:
            return None
        return {"username": self.guest_username, "password": crypto.decrypt(self.encrypted_guest_password)}


class HostImage(models.Model):
    """One variant cached on one host. ``staging`` rows are the transfer throttle's slots."""

    class State(models.TextChoices):
        STAGING = "staging", "staging"
        STAGED = "staged", "staged"
        FAILED = "failed", "failed"

    host = models.ForeignKey("inventory.Hypervisor", on_delete=models.CASCADE, related_name="cached_images")
    variant = models.ForeignKey(ImageVariant, on_delete=models.CASCADE, related_name="cached_on")
    state = models.CharField(max_length=10, choices=State.choices, default=State.STAGING)
    location = models.CharField(max_length=1000, blank=True, help_text="Where the host keeps it.")
    error = models.TextField(blank=True)
    staging_job = models.PositiveBigIntegerField(null=True, blank=True, help_text="The job copying it now.")
    started = models.DateTimeField(null=True, blank=True)
    staged_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["host", "variant"]
        constraints = [models.UniqueConstraint(fields=["host", "variant"], name="hostimage_unique")]

    def __str__(self):
        return f"{self.variant} on {self.host} ({self.state})"


class VM(models.Model):
    class Warm(models.TextChoices):
        """A VM's part in its image's warm pool (``provisioning.warm``); blank: none."""

        WARM = "warm", "warm: booted with no login, waiting in the pool"
        HIT = "hit", "taken warm from the pool by a reservation (back to the pool, or destroyed, after it)"
        MISS = "miss", "built cold for a reservation of a pooled image"

    class State(models.TextChoices):
        REQUESTED = "requested", "requested"
        STAGING = "staging", "staging image"
        DEFINING = "defining", "defining"
        STARTING = "starting", "starting"
        RUNNING = "running", "running"
        STOPPED = "stopped", "stopped"
        SUSPENDED = "suspended", "suspended"
        MIGRATING = "migrating", "migrating"
        DESTROYED = "destroyed", "destroyed"
        FAILED = "failed", "failed"
        ERROR = "error", "error: may still be on its host"
        LOST = "lost", "lost: its host died (verify destroys it if the host returns)"

    # States in which the VM exists (or may exist) on a hypervisor. ``error``: removing it
    # failed (or a migration lost track of it); it keeps its claims, with no end, until a
    # vm.destroy succeeds or verify/repair settles it; ``error`` says why.
    LIVE = ("staging", "defining", "starting", "running", "stopped", "suspended", "migrating", "error")
    BUILT = ("running", "stopped", "suspended")  # made, and not in the middle of a job's change

    name = models.CharField(max_length=100, blank=True)
    image = models.ForeignKey(Image, on_delete=models.PROTECT, related_name="vms")
    variant = models.ForeignKey(ImageVariant, null=True, blank=True, on_delete=models.PROTECT, related_name="vms")
    # The image's revision it is built from (the production one when it was requested): a
    # rebuild, repair or reuse keeps it, whatever is production since.
    revision = models.ForeignKey(ImageRevision, null=True, blank=True, on_delete=models.PROTECT, related_name="vms")
    host = models.ForeignKey(
        "inventory.Hypervisor", null=True, blank=True, on_delete=models.PROTECT, related_name="vms"
    )
    allocation = models.ForeignKey(
        "capacity.Allocation", null=True, blank=True, on_delete=models.SET_NULL, related_name="vms"
    )
    target_allocation = models.ForeignKey(
        "capacity.Allocation",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Claim on the target of a migration.",
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="vms"
    )
    state = models.CharField(max_length=12, choices=State.choices, default=State.REQUESTED)
    vcpus = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    memory_mib = models.PositiveIntegerField(validators=[MinValueValidator(16)])
    disk_gib = models.PositiveIntegerField()
    end = models.DateTimeField(null=True, blank=True, help_text="When the claim ends (blank: open).")
    adhoc = models.BooleanField(
        default=True,
        help_text="Requested on its own: its end and quota are its own (no: built on a reservation's claim).",
    )
    address = models.GenericIPAddressField(null=True, blank=True)
    port = models.PositiveIntegerField(
        null=True, blank=True, help_text="The login port at the address (blank: the usual one, 22 or 3389)."
    )
    ssh_key = models.TextField(blank=True, help_text="A public key the guest lets its owner in with.")
    snapshots = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True)
    tags = TaggableManager(blank=True, help_text="Free labels (Ganeti's instance tags, set through the RAPI).")
    host_key = models.CharField(
        max_length=200,
        blank=True,
        help_text="The hypervisor's name of a VM adopted by verify/repair (blank: vcl-<id>, made by vclmgr).",
    )
    hostname = models.CharField(
        max_length=63, blank=True, help_text="The guest's hostname (an environment's member name; blank: its key)."
    )
    networks = models.ManyToManyField(
        "PrivateNetwork", blank=True, related_name="vms", help_text="Private networks it has a NIC on, in order."
    )
    warm = models.CharField(
        max_length=4, choices=Warm.choices, blank=True, help_text="Its part in its image's warm pool (blank: none)."
    )
    warm_takes = models.PositiveIntegerField(
        default=0, help_text="Reservations that took it warm (reverted to its warm snapshot after each)."
    )
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["host", "state"], name="vm_host_state")]
        verbose_name = "VM"

    def __str__(self):
        return self.name or self.key

    @property
    def key(self):
        if self.host_key:
            return self.host_key
        return vm_key(self.pk) if self.pk else ""

    @property
    def resources(self):
        return {"vcpus": self.vcpus, "memory_mib": self.memory_mib, "disk_gib": self.disk_gib}


class PrivateNetwork(models.Model):
    """An isolated L2 network on one host between the VMs of one environment (``drivers.base.
    NetworkSpec``): made on the host before the first of its VMs is defined, removed with the
    last of them. ``members``: the hostnames, the fixed addresses in order.

    A network whose members are spread over hosts of one overlay has a row on each of those
    hosts, under one key, on one ``segment`` of the ``overlay``; the ``home`` one (its first
    member's host) serves its DHCP and DNS, the others reach them over the overlay."""

    key = models.CharField(max_length=63, help_text="Its name on the host, e.g. env12-lan.")
    name = models.CharField(max_length=63, help_text="The template's name for it, e.g. lan.")
    host = models.ForeignKey("inventory.Hypervisor", on_delete=models.PROTECT, related_name="private_networks")
    cidr = models.CharField("CIDR", max_length=18)
    members = models.JSONField(default=list, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    removed = models.DateTimeField(null=True, blank=True, help_text="When it was removed from its host.")
    overlay = models.CharField(max_length=100, blank=True, help_text="The overlay it spans hosts on (blank: none).")
    segment = models.PositiveIntegerField(null=True, blank=True, help_text="Its segment of the overlay (a VLAN tag).")
    home = models.BooleanField(default=True, help_text="This host serves its DHCP and DNS.")

    class Meta:
        ordering = ["key"]
        constraints = [
            models.UniqueConstraint(fields=["key", "host"], name="privatenetwork_key_per_host"),
            # one live network per segment of an overlay (each spread network has one home row)
            models.UniqueConstraint(
                fields=["overlay", "segment"],
                condition=models.Q(home=True, removed__isnull=True, segment__isnull=False),
                name="privatenetwork_segment_per_overlay",
            ),
        ]

    def __str__(self):
        return f"{self.key} ({self.cidr})"


class QuotaRule(models.Model):
    """Limits for the members of a group (blank group: everybody), for one image or all.

    Every rule that applies to a user and image binds, next to the site defaults: a rule can
    only tighten a default (a rule above one is refused when saved), and an image's rule counts
    only that image's reservations and VMs. A refusal names the rule (``quotas.py``).
    """

    name = models.CharField(max_length=100, unique=True)
    group = models.ForeignKey("auth.Group", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    image = models.ForeignKey(Image, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    max_duration_minutes = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    max_per_user = models.PositiveIntegerField(
        null=True, blank=True, help_text="Concurrent reservations and VMs of one member."
    )
    max_per_group = models.PositiveIntegerField(
        null=True, blank=True, help_text="Concurrent reservations and VMs of all members together."
    )
    max_vcpus = models.PositiveIntegerField(
        null=True, blank=True, help_text="vCPUs of all members' concurrent reservations and VMs together."
    )
    max_memory_mib = models.PositiveIntegerField(
        null=True, blank=True, help_text="Memory (MiB) of all members' concurrent reservations and VMs together."
    )

    # Limits that exist per user at the site level, and the setting that holds each default.
    SITE_DEFAULTS = {"max_duration_minutes": "RESERVATION_MAX_MINUTES", "max_per_user": "RESERVATION_MAX_PER_USER"}
    GROUP_LIMITS = ("max_per_group", "max_vcpus", "max_memory_mib")

    class Meta:
        db_table = "reservations_quotarule"  # moved here from the reservations app, rows and all
        ordering = ["name"]

    def __str__(self):
        return self.name

    def clean(self):
        """A rule tightens the site defaults, never raises them; a group's total needs a group.
        (Plain checks on the row itself: the admin's form and the API's serializer run them.)"""
        errors = {}
        for field, setting in self.SITE_DEFAULTS.items():
            value, default = getattr(self, field), getattr(settings, setting)
            if value is not None and value > default:
                errors[field] = [
                    f"at most the site default {default} ({setting}): a rule can only tighten it, never raise it"
                ]
        if self.group_id is None:
            for field in self.GROUP_LIMITS:
                if getattr(self, field) is not None:
                    errors[field] = ["a limit for all members together needs a group"]
        if errors:
            raise ValidationError(errors)


class VerifyReport(models.Model):
    """One run of the hypervisor check of ``cluster.verify`` (``provisioning.verify``):
    what each host runs against what the database says, and claims against what holds them."""

    created = models.DateTimeField(auto_now_add=True)
    job_id = models.PositiveBigIntegerField(null=True, blank=True, help_text="The cluster.verify job that ran it.")
    hosts_checked = models.PositiveIntegerField(default=0)
    findings = models.JSONField(default=list, blank=True, help_text='[{"kind", "message", "host", "vm", ...}]')

    class Meta:
        ordering = ["-id"]

    def __str__(self):
        return f"verify {self.created:%Y-%m-%d %H:%M}: {len(self.findings)} findings"


class Plan(models.Model):
    """A move plan computed as a dry run (``provisioning.plans``): balance (hbal), squeeze
    (hsqueeze), evacuate a node or a node group. Executing it submits one ``vm.migrate`` job per
    move; the row keeps the moves, the scores, the hosts to power off or on, the claims it
    touches and what the cluster looked like (``basis``) so a stale plan is refused."""

    class Kind(models.TextChoices):
        BALANCE = "balance", "balance (hbal)"
        SQUEEZE = "squeeze", "squeeze (hsqueeze)"
        EVACUATE_NODE = "evacuate-node", "evacuate a node"
        EVACUATE_GROUP = "evacuate-group", "evacuate a node group"

    class State(models.TextChoices):
        COMPUTED = "computed", "computed (dry run)"
        EXECUTING = "executing", "executing"
        DONE = "done", "done"
        FAILED = "failed", "failed (some moves did not happen)"
        CANCELED = "canceled", "canceled"

    FINAL = ("done", "failed", "canceled")

    kind = models.CharField(max_length=20, choices=Kind.choices)
    state = models.CharField(max_length=10, choices=State.choices, default=State.COMPUTED)
    target = models.CharField(max_length=100, blank=True, help_text="The node or node group it is about.")
    options = models.JSONField(default=dict, blank=True)
    reason = models.CharField(max_length=1000, blank=True)
    rate_limit = models.PositiveIntegerField(default=4, validators=[MinValueValidator(1)])
    score_before = models.FloatField(null=True, blank=True)
    score_after = models.FloatField(null=True, blank=True)
    moves = models.JSONField(default=list, blank=True, help_text='[{"vm", "from", "to", "depends", "job", ...}]')
    power_off = models.JSONField(default=list, blank=True, help_text="Hosts emptied and then powered off.")
    power_on = models.JSONField(default=list, blank=True, help_text="Hosts to bring back first.")
    claims = models.JSONField(default=list, blank=True, help_text="Future claims it touches, and how.")
    basis = models.JSONField(default=dict, blank=True, help_text="Per host: state and live claims at compute.")
    utilisation = models.JSONField(default=dict, blank=True, help_text='{"before": [...], "after": [...]}')
    notes = models.JSONField(default=list, blank=True)
    jobs = models.JSONField(default=list, blank=True, help_text="Other jobs it submitted (power, re-placing).")
    created = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=150, blank=True)
    executed = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self):
        return f"plan {self.pk} {self.kind} {self.target}".strip()

    @property
    def bucket(self):
        return f"rate-limit:{self.rate_limit}:plan-{self.pk}"


class ImageUpload(models.Model):
    """A disk image a user is uploading (resumably: ``provisioning.uploads``). Its bytes so far
    are the private file ``<IMAGE_UPLOAD_DIR>/<id>.part``, exactly ``offset`` long. When the
    last byte arrives the disk is ``checking`` (a job), then ``done`` with its ``image``, or
    ``refused`` with the ``reason`` (the file is gone either way). ``stored_bytes``: what the accepted disk takes in
    the image store, counted against its owner's image-storage quota while the image exists."""

    class State(models.TextChoices):
        RECEIVING = "receiving", "receiving"
        CHECKING = "checking", "checking"
        DONE = "done", "done"
        REFUSED = "refused", "refused"

    FORMATS = ("qcow2", "raw", "ova")

    id = models.UUIDField(primary_key=True, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="image_uploads")
    name = models.CharField(max_length=100, help_text=NAME_HELP)
    format = models.CharField(max_length=10, choices=[(f, f) for f in FORMATS])
    length = models.PositiveBigIntegerField()
    offset = models.PositiveBigIntegerField(default=0)
    state = models.CharField(max_length=12, choices=State.choices, default=State.RECEIVING)
    reason = models.TextField(blank=True)
    image = models.ForeignKey(Image, null=True, blank=True, on_delete=models.SET_NULL, related_name="uploads")
    stored_bytes = models.PositiveBigIntegerField(default=0)
    created = models.DateTimeField(auto_now_add=True)
    touched = models.DateTimeField(default=timezone.now, help_text="The last byte received (expiry counts from it).")

    class Meta:
        ordering = ["-created"]

    def __str__(self):
        return f"{self.name} ({self.format}, {self.offset}/{self.length})"
