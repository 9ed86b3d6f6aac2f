"""State of simulated hypervisors and their VMs.

It lives in the database so every web and worker process sees the same hosts, VMs and
injected faults. Only ``drivers.sim`` (the driver and its services) writes it.
"""

import ipaddress

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models

from drivers.sim import steps


def validate_dhcp_pool(value):
    try:
        pool = ipaddress.IPv4Network(value)
    except ValueError as exc:
        raise ValidationError(f"{value!r} is not an IPv4 network: {exc}", code="invalid") from None
    if pool.num_addresses < 4:
        raise ValidationError("needs at least 4 addresses", code="invalid")


class SimHost(models.Model):
    """An emulated hypervisor, named like the ``sim://<name>`` URI that reaches it."""

    name = models.CharField(max_length=100, unique=True)
    cpus = models.PositiveIntegerField(default=16, validators=[MinValueValidator(1)])
    memory_mib = models.PositiveIntegerField(default=65536, validators=[MinValueValidator(1)])
    disk_gib = models.PositiveIntegerField(default=1000)
    dhcp_pool = models.CharField(
        max_length=43,
        default="10.77.0.0/16",
        validators=[validate_dhcp_pool],
        help_text="Network the simulated DHCP server leases addresses from.",
    )
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "simulated host"

    def __str__(self):
        return self.name


class SimImage(models.Model):
    """An image staged (cached) on a simulated host."""

    host = models.ForeignKey(SimHost, on_delete=models.CASCADE, related_name="images")
    name = models.CharField(max_length=130, help_text="Name on the host: image name + content tag.")
    format = models.CharField(max_length=10)
    location = models.CharField(max_length=500)
    checksum = models.CharField(max_length=200, blank=True)
    size_gib = models.PositiveIntegerField(default=0)
    captured_from = models.CharField(max_length=63, blank=True, help_text="Key of the VM it was captured from.")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["host", "name"]
        constraints = [models.UniqueConstraint(fields=["host", "name"], name="simimage_unique_per_host")]

    def __str__(self):
        return self.name


class SimVM(models.Model):
    class State(models.TextChoices):
        RUNNING = "running"
        STOPPED = "stopped"
        SUSPENDED = "suspended"
        ERROR = "error"

    # Unique across hosts, like a VM name in one vCenter: a VM lives on exactly one host.
    key = models.CharField(max_length=63, unique=True)
    host = models.ForeignKey(SimHost, on_delete=models.CASCADE, related_name="vms")
    state = models.CharField(max_length=10, choices=State.choices, default=State.STOPPED)
    vcpus = models.PositiveIntegerField()
    memory_mib = models.PositiveIntegerField()
    disk_gib = models.PositiveIntegerField()
    image = models.CharField(max_length=130, help_text="Staged image the disk is an overlay of.")
    image_format = models.CharField(max_length=10)
    network = models.CharField(max_length=100)
    fingerprint = models.CharField(max_length=64)
    address = models.GenericIPAddressField(null=True, blank=True, unique=True, protocol="IPv4")
    snapshots = models.JSONField(default=list, blank=True, help_text='[{"name", "state", "created", "seed"}]')
    seed = models.JSONField(
        default=dict, blank=True, help_text='Its seed: {"instance_id", "digest"} (never the login itself).'
    )
    guest = models.JSONField(
        default=dict,
        blank=True,
        help_text='The emulated guest: {"files": {path: base64}, "execs": {tag: {...}}} (never runs anything).',
    )
    # Who is "logged in" to the emulated guest (``services.set_sessions``): what the driver's
    # guest_sessions reports while the VM runs, so idle reclamation can be tested without a guest.
    sessions = models.JSONField(
        default=list, blank=True, help_text='[{"user", "login_time", "idle_seconds"}]; emptied when it stops.'
    )
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["key"]
        verbose_name = "simulated VM"

    def __str__(self):
        return self.key


class SimNetwork(models.Model):
    """A private network of a simulated host (``base.NetworkSpec``): isolated, its members'
    fixed addresses and names in ``hosts``; a VM's NICs on it are ``SimNIC`` rows. One spread
    over hosts of an overlay is a row on each, on one ``segment``: one L2 network, whose
    addresses are given out once across them (``home``: the host that serves its DHCP)."""

    host = models.ForeignKey(SimHost, on_delete=models.CASCADE, related_name="networks")
    key = models.CharField(max_length=63)
    cidr = models.CharField(max_length=43)
    hosts = models.JSONField(default=list, blank=True, help_text='[["hostname", "mac"], …]: fixed addresses, in order.')
    fingerprint = models.CharField(max_length=64)
    overlay = models.CharField(max_length=100, blank=True)
    segment = models.PositiveIntegerField(null=True, blank=True)
    home = models.BooleanField(default=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["host", "key"]
        verbose_name = "simulated private network"
        constraints = [models.UniqueConstraint(fields=["host", "key"], name="simnetwork_unique_per_host")]

    def __str__(self):
        return self.key


class SimNIC(models.Model):
    """A VM's NIC on a private network, with the address the network's DHCP gives it."""

    vm = models.ForeignKey(SimVM, on_delete=models.CASCADE, related_name="nics")
    # RESTRICT: a network in use cannot go (its host, deleted with its VMs, still can).
    network = models.ForeignKey(SimNetwork, on_delete=models.RESTRICT, related_name="nics")
    mac = models.CharField(max_length=17)
    address = models.GenericIPAddressField(protocol="IPv4")

    class Meta:
        ordering = ["vm", "id"]
        verbose_name = "simulated private NIC"
        constraints = [
            models.UniqueConstraint(fields=["vm", "network"], name="simnic_one_per_network"),
            models.UniqueConstraint(fields=["network", "mac"], name="simnic_unique_mac"),
            models.UniqueConstraint(fields=["network", "address"], name="simnic_unique_address"),
        ]

    def __str__(self):
        return f"{self.mac} {self.address}"


class SimFault(models.Model):
    """A fault injected into one step (or every step, ``*``) of one simulated host."""

    class Mode(models.TextChoices):
        FAIL = "fail", "fail (permanent error)"
        FAIL_ONCE = "fail_once", "fail once (temporary error), then succeed"
        HANG = "hang", "hang (no answer for `seconds`, then unreachable)"
        SLOW = "slow", "slow (take `seconds` longer, then succeed)"
        UNREACHABLE = "unreachable", "unreachable (temporary error)"

    host = models.ForeignKey(SimHost, on_delete=models.CASCADE, related_name="faults")
    step = models.CharField(max_length=20, choices=steps.CHOICES)
    mode = models.CharField(max_length=12, choices=Mode.choices)
    seconds = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0)])
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["host", "step"]
        constraints = [models.UniqueConstraint(fields=["host", "step"], name="simfault_unique_per_step")]

    def __str__(self):
        return f"{self.step}: {self.mode}"


class SimExecProfile(models.Model):
    """What a command "run" in a simulated guest of one image gives back (the simulator never
    runs a user's command): its output, exit status, how long it takes and the files it leaves
    in the work directory. Without a profile, a command prints one line naming itself and exits 0."""

    image = models.CharField(max_length=100, unique=True, help_text="The image's name.")
    output = models.TextField(blank=True, help_text="Printed as the command runs (before `repeat`).")
    output_hex = models.TextField(blank=True, help_text="Raw bytes (hex) printed after `output`: non-UTF-8 output.")
    repeat = models.PositiveIntegerField(default=1, help_text="The output printed this many times.")
    exit_status = models.IntegerField(default=0)
    seconds = models.FloatField(default=0, validators=[MinValueValidator(0)], help_text="How long it runs.")
    files = models.JSONField(
        default=dict, blank=True, help_text='Left in the work directory when it ends: {"relative/path": "text"}.'
    )

    class Meta:
        ordering = ["image"]
        verbose_name = "simulated command profile"

    def __str__(self):
        return self.image
