"""Image library and VM verbs. Web, API, CLI, demo and jobs call these; one function per verb.

Each verb validates first (Django ``ValidationError`` with per-field messages; nothing is
written when anything is wrong), writes in one transaction, records the change log and emits
events in that transaction. Verbs that touch a hypervisor do not call it: they *submit a job*
(``provisioning.opcodes``) and return it. State conflicts raise ``Conflict``; deleting
something still used raises ``InUse``. The acting user is always the keyword ``actor=``.
``demand_for``/``vm_demand`` build every VM's placement ``Demand`` (VMs and reservations).
An ad-hoc VM (not a reservation's) has its own end and quota (``request_vm``, ``quotas``) and
is destroyed when its end passes (``end_overdue``, run by the VM clock in ``tasks``); no VM
runs without a live claim or past its end (``run_refusal``).
"""

import re
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import IntegrityError, transaction
from django.db.models import FilteredRelation, Max, Prefetch, ProtectedError, Q, RestrictedError
from django.utils import timezone

from accounts import access
from capacity import services as capacity
from core import changelog, events, outbound, topics
from core.changelog import Actor
from core.errors import Conflict, InUse
from drivers import base, cloudinit, registry
from drivers.base import vm_key
from jobs import kept_records
from jobs import services as jobs
from jobs.models import Job
from placement import devices
from provisioning import quotas, revisions
from provisioning.models import VM, HostImage, Image, ImageRevision, ImageVariant

IMAGE_FIELDS = (
    "name", "os", "platform", "description", "min_vcpus", "min_memory_mib", "min_disk_gib", "default_vcpus",
    "default_memory_mib", "default_disk_gib", "visibility", "parent", "revert_on_end", "pool_size", "active",
    "user_data", "ready_timeout", "readiness", "required_tags", "forbidden_tags", "anti_affinity", "exclusive_storage",
    "max_concurrent", "on_host_failure", "owner", "requires_approval", "default_gpus", "default_gpu_model",
    "warm_min", "warm_max",
)  # fmt: skip
MAX_TAGS = 20
GROUP_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
KERNEL_FIELDS = ("kernel", "kernel_checksum", "initrd", "initrd_checksum", "kernel_args")
VARIANT_FIELDS = ("hypervisor_type", "format", "location", "checksum", "size_gib", "guest_username", *KERNEL_FIELDS)
ACTIONS = ("start", "stop", "suspend", "resume", "destroy")
CLEAN_SNAPSHOT = "clean"  # a revert_on_end VM's state before its first boot (opcodes/reuse.py)
WARM_SNAPSHOT = "warm"  # a pooled run VM booted, memory included, before any run's input (opcodes/reuse.py)
POWER_ON = ("start", "resume", "revert")  # actions that may make a VM run: a live claim needed
END_RETRY = timedelta(minutes=10)
NEEDS_BUILT = ("start", "stop", "suspend", "resume", "snapshot", "revert", "migrate", "capture")  # not mid-create


# --- who sees what ----------------------------------------------------------------------


def visible_images(user):
    """Images a user may use: all for staff; active public ones and their groups' otherwise."""
    return Image.objects.visible_to(user)


@dataclass(frozen=True)
class Usable:
    """What placing a VM of an image needs to know of it (``usable``)."""

    staged: frozenset  # ids of the hosts where one of them is staged (placement tries them first)
    variants: dict  # {hypervisor type: variant id}, in type order (``pick_variant``)

    def variant_on(self, host_type):
        """The id of the variant a host of ``host_type`` runs, or None (also for no type)."""
        return pick_variant(self.variants, host_type) if host_type else None


def usable(user, image):
    """``Usable`` of ``image`` for ``user`` (None: the system), read in one statement; None
    when the user may not use it, or it has no variant (the caller tells which, if it cares).
    The variants are those of the image's production revision (what new VMs are built from)."""
    variants = ImageVariant.objects.production().filter(image_id=image.pk)
    if user is not None:
        variants = variants.filter(image__in=visible_images(user).values("pk"))
    staged = FilteredRelation("cached_on", condition=Q(cached_on__state=HostImage.State.STAGED))
    columns = ("staged__host_id", "hypervisor_type", "id")
    rows = list(variants.annotate(staged=staged).order_by("hypervisor_type").values_list(*columns))
    if not rows:
        return None
    return Usable(frozenset(h for h, *_ in rows if h is not None), {kind: pk for _, kind, pk in rows})


def with_production_variants(images):
    """``images`` with their production revisions' variants read in one more query: on
    each, ``variants.all()`` is those (what new VMs are built from)."""
    return images.prefetch_related(Prefetch("variants", queryset=ImageVariant.objects.production()))


def pick_variant(variants, host_type):
    """The one of ``variants`` (by hypervisor type, in type order) a host of ``host_type`` runs:
    its own type's; the first on a simulated host told to run any image
    (``registry.runs_any_image``). None when there is none: a host runs no other type's image."""
    found = variants.get(host_type)
    if found is None and variants and registry.runs_any_image(host_type):
        found = next(iter(variants.values()))
    return found


def visible_vms(user):
    if access.can(user, "see_all"):
        return VM.objects.all()
    return VM.objects.filter(owner=user)


def operable_vms(user):
    """The VMs ``user`` may look up to act on as an operator (a resize): every VM for operators
    and auditors, else their own. Whether the action is allowed stays with the action's service."""
    if access.can(user, "operate") or access.can(user, "see_all"):
        return VM.objects.all()
    return VM.objects.filter(owner=user)


def may_see_vm(user, vm_id):
    """Topic authoriser for ``vm.<id>``: the owner, auditors and administrators."""
    if access.can(user, "see_all"):
        return True
    return str(vm_id).isdigit() and VM.objects.filter(pk=int(vm_id), owner=user).exists()


# --- images -----------------------------------------------------------------------------


def _validate(obj, exclude=()):
    try:
        obj.full_clean(exclude=list(exclude))
    except ValidationError as exc:
        raise ValidationError(exc.message_dict) from None


def _check_image(image):
    errors = {}
    try:
        base.check_image_name(image.name)
    except base.DriverError as exc:
        errors["name"] = [str(exc)]
    for low, default in (
        ("min_vcpus", "default_vcpus"),
        ("min_memory_mib", "default_memory_mib"),
        ("min_disk_gib", "default_disk_gib"),
    ):
        if (getattr(image, default) or 0) < (getattr(image, low) or 0):
            errors[default] = [f"must be at least {low} ({getattr(image, low)})"]
    if image.default_gpu_model and not image.default_gpus:
        errors["default_gpu_model"] = ["a GPU model needs default GPUs of 1 or more"]
    if image.parent_id and image.pk and image.parent_id == image.pk:
        errors["parent"] = ["an image cannot be its own parent"]
    for name in ("required_tags", "forbidden_tags"):
        try:
            setattr(image, name, clean_tags(getattr(image, name)))
        except ValueError as exc:
            errors[name] = [str(exc)]
    both = set(image.required_tags) & set(image.forbidden_tags) if "required_tags" not in errors else set()
    if both and "forbidden_tags" not in errors:
        errors["forbidden_tags"] = [f"required and forbidden at once: {', '.join(sorted(both))}"]
    image.anti_affinity = (image.anti_affinity or "").strip()
    if image.anti_affinity and not GROUP_RE.match(image.anti_affinity):
        errors["anti_affinity"] = ["a group name: letters, digits, '.', '_', ':' and '-'"]
    refusal = pool_refusal(image.visibility, image.pool_size)
    if refusal:
        errors["pool_size"] = [refusal]
    errors.update(warm_refusals(image))
    user_data = cloudinit.image_config_error(image.user_data)
    if user_data:
        errors["user_data"] = [user_data]
    if errors:
        raise ValidationError(errors)


def pool_refusal(visibility, pool_size):
    """Why an image of ``visibility`` may not keep a pool of ``pool_size`` VMs, or None: a
    pooled VM goes to the next run of anyone allowed, so an access-controlled image never pools
    (DRM: secure jobs get their VM rolled back and destroyed, not handed on)."""
    if pool_size and visibility != Image.Visibility.PUBLIC:
        return "a restricted (access-controlled) image never pools its VMs: pool size must be 0"
    return None


def warm_refusals(image):
    """Per-field errors of an image's warm pool sizes (empty: acceptable)."""
    low, high = image.warm_min or 0, image.warm_max or 0
    if low > high:
        return {"warm_max": [f"must be at least the minimum ({low})"]}
    if high and image.revert_on_end:
        # Its reservations take parked VMs reverted clean already; a warm VM is destroyed after use.
        return {"warm_max": ["an image that reverts on end reuses its parked VMs: no warm pool (0)"]}
    if image.max_concurrent is not None and high > image.max_concurrent:
        # Warm VMs take no seat of the cap (nobody uses them), but no more can ever be in use at once.
        return {"warm_max": [f"at most the image's licence cap ({image.max_concurrent}): more could never be used"]}
    return {}


def clean_tags(tags):
    """Host tag names as stored (stripped, unique, sorted); ValueError saying what is wrong.
    A comma-separated string is accepted too (forms, the CLI)."""
    if tags in (None, ""):
        return []
    if isinstance(tags, str):
        tags = tags.split(",")
    if not isinstance(tags, (list, tuple)) or not all(isinstance(tag, str) for tag in tags):
        raise ValueError("a list of tag names")
    names = sorted({tag.strip() for tag in tags if tag.strip()})
    for name in names:
        if len(name) > 100 or "," in name or not name.isprintable():
            raise ValueError(f"{name[:20]!r} is not a tag name (at most 100 printable characters, no comma)")
    if len(names) > MAX_TAGS:
        raise ValueError(f"at most {MAX_TAGS} tags")
    return names


def create_image(*, actor, groups=(), reason="", **fields):
    unknown = set(fields) - set(IMAGE_FIELDS)
    if unknown:
        raise ValidationError({name: ["unknown field"] for name in sorted(unknown)})
    image = Image(**fields)
    _check_image(image)
    _validate(image)
    with transaction.atomic():
        image.save()
        image.groups.set(groups)
        changelog.record(image, "create", actor, reason=reason)
        events.emit("image.created", _image_event(image), ["admin"])
    return image


def update_image(image, *, actor, groups=None, reason="", **fields):
    unknown = set(fields) - set(IMAGE_FIELDS)
    if unknown:
        raise ValidationError({name: ["unknown field"] for name in sorted(unknown)})
    before = {name: getattr(image, name) for name in fields}
    for name, value in fields.items():
        setattr(image, name, value)
    _check_image(image)
    _validate(image)
    with transaction.atomic():
        image.save()
        if groups is not None:
            image.groups.set(groups)
        changes = changelog.diff(before, fields, list(fields))
        changelog.record(image, "update", actor, changes, reason)
        events.emit("image.updated", _image_event(image), ["admin"])
    return image


def delete_image(image, reason="", *, actor):
    if image.vms.exists():
        raise InUse(f"image {image.name} is used by {image.vms.count()} VMs; deactivate it instead")
    try:
        with transaction.atomic():
            changelog.record(image, "delete", actor, reason=reason)
            events.emit("image.deleted", _image_event(image), ["admin"])
            image.delete()
    except (ProtectedError, RestrictedError) as exc:
        # Apps above this one (reservations, blocks) protect their images; name what holds it.
        users = Counter(type(obj)._meta.verbose_name_plural for obj in exc.args[1])
        held = ", ".join(f"{n} {kind}" for kind, n in sorted(users.items()))
        raise InUse(f"image {image.name} is used by {held}; deactivate it instead") from None


def add_variant(image, reason="", *, actor, guest_password="", revision=None, **fields):
    """A new variant of ``image``, in ``revision`` (default: the production revision; an image
    without revisions gets its first). ``guest_password``: the password of its ``guest_username``
    (VMware guest operations), stored encrypted and never shown again."""
    unknown = set(fields) - set(VARIANT_FIELDS)
    if unknown:
        raise ValidationError({name: ["unknown field"] for name in sorted(unknown)})
    variant = ImageVariant(image=image, **fields)
    _check_guest_login(variant.guest_username, guest_password)
    variant.set_guest_password(guest_password or "")
    _check_variant(variant)
    _validate(variant, exclude=["image", "revision"])
    changes = {"guest_password": ["***", "***"]} if guest_password else None
    try:
        with transaction.atomic():
            variant.revision = revision or revisions.production_for_variant(image, actor=actor)
            variant.save()
            changelog.record(variant, "create", actor, changes, reason=reason)
    except IntegrityError:
        raise ValidationError(
            {"hypervisor_type": [f"{variant.revision} already has a {variant.hypervisor_type} variant"]}
        ) from None
    return variant


def add_revision(image, *, actor, variants, parent=None, comment="", reason=""):
    """A new ``testing`` revision of ``image`` with ``variants`` (dicts of the variant fields,
    ``guest_password`` included, as for ``add_variant``). ``parent``: the revision it
    was made from (default: the production one). All or nothing."""
    if not variants:
        raise ValidationError({"variants": ["a revision needs at least one variant (its disk)"]})
    if parent is not None and parent.image_id != image.pk:
        raise ValidationError({"parent": [f"revision {parent.number} is not one of {image.name}'s"]})
    with transaction.atomic():
        revisions.lock(image)
        number = (image.revisions.aggregate(n=Max("number"))["n"] or 0) + 1
        revision = ImageRevision.objects.create(
            image=image,
            number=number,
            state=revisions.State.TESTING,
            created_by=revisions.user_of(actor),
            parent=parent or revisions.production(image),
            comment=comment,
        )
        changelog.record(revision, "create", actor, {"comment": ["", comment]} if comment else None, reason)
        for fields in variants:
            add_variant(image, actor=actor, revision=revision, reason=reason, **fields)
    return revision


def set_guest_login(variant, *, actor, username, password=None, reason=""):
    """Set the account VMware guest operations log in as. ``password=None`` keeps the stored
    one; ``username=""`` removes the login (and its password)."""
    if not username:
        password = ""
    elif password is None and not variant.has_guest_password:
        password = ""
    _check_guest_login(username, password if password is not None else "(kept)")
    changes = {}
    if username != variant.guest_username:
        changes["guest_username"] = [variant.guest_username, username]
    if password is not None and (password or variant.has_guest_password):
        changes["guest_password"] = ["***", "***"]
        variant.set_guest_password(password)
    variant.guest_username = username
    if changes:
        with transaction.atomic():
            variant.save(update_fields=["guest_username", "encrypted_guest_password"])
            changelog.record(variant, "update", actor, changes, reason=reason)
    return variant


def _check_guest_login(username, password):
    if bool(username) != bool(password):
        which = "guest_password" if username else "guest_username"
        raise ValidationError({which: ["a guest login needs both a user and a password"]})


def delete_variant(variant, reason="", *, actor):
    if variant.vms.filter(state__in=VM.LIVE).exists():
        raise InUse(f"{variant} is used by live VMs")
    with transaction.atomic():
        changelog.record(variant, "delete", actor, reason=reason)
        variant.delete()


def _check_variant(variant):
    from inventory.models import Hypervisor

    errors = {}
    accepted = Hypervisor.IMAGE_FORMATS.get(variant.hypervisor_type)
    if accepted is not None and variant.format not in accepted:
        errors["format"] = [f"{variant.hypervisor_type} hosts run {' or '.join(accepted)} images"]
    try:
        spec(variant).validate()
    except base.DriverError as exc:
        errors.setdefault(_kernel_field(str(exc)) or "location", [str(exc)])
    for name in ("location", "kernel", "initrd"):
        where = getattr(variant, name)
        if where.startswith(("http://", "https://")) and name not in errors:
            refused = outbound.refusal(where)
            if refused:
                errors[name] = [f"not allowed: {refused} (VCLMGR_OUTBOUND_ALLOW names exceptions)"]
    if errors:
        raise ValidationError(errors)


def _kernel_field(message):
    """The kernel field a spec's complaint is about (the form shows it there), or None."""
    about = message.partition(": ")[2]  # after "image <name>: "
    if about.endswith("without a kernel"):
        return "kernel"  # what is missing
    for name in ("kernel_args", "kernel_checksum", "initrd_checksum", "initrd", "kernel"):
        if name in about:
            return name
    return None


def spec(variant):
    """The driver's view of a variant."""
    return base.ImageVariantSpec(
        name=variant.image.name,
        format=variant.format,
        location=variant.location,
        checksum=variant.checksum,
        size_gib=variant.size_gib,
        **{name: getattr(variant, name) for name in KERNEL_FIELDS},
    )


def login_protocol(image):
    """How a user logs into the image's VMs: ``rdp`` for Windows, else ``ssh``."""
    return "rdp" if "windows" in (image.os or "").lower() else "ssh"


def guest_flavour(image):
    """Which first-boot agent the image runs: cloudbase-init on Windows (the RDP images), else
    cloud-init. The guest's seed is written in its dialect (``cloudinit.GuestLogin.flavour``)."""
    return cloudinit.CLOUDBASE_INIT if login_protocol(image) == "rdp" else cloudinit.CLOUD_INIT


def login_port(image):
    """The guest port of that login service (a VM's own ``port`` says where it is reached)."""
    return 3389 if login_protocol(image) == "rdp" else 22


def _image_event(image):
    return {"id": image.pk, "name": image.name, "active": image.active}


# --- VMs --------------------------------------------------------------------------------


def request_vm(
    *,
    actor,
    owner,
    image,
    vcpus=None,
    memory_mib=None,
    disk_gib=None,
    name="",
    end=None,
    allocation=None,
    reason="",
    ssh_key="",
    checked=False,
    savepoint=True,
    depends=(),
    variant=None,
    revision=None,
):
    """Record a VM and submit the ``vm.create`` job that builds it; returns ``(vm, job)``.

    ``checked``: the caller validated the image for ``owner`` in this request (not read again).
    ``savepoint`` False: in a caller's transaction that is all or nothing (no savepoint of its own).

    ``allocation``: an existing claim to build it on (a reservation's, whose quota and end
    govern it); None: an ad-hoc VM, which claims when built. A non-staff owner's ad-hoc VM
    always has an end (``end``, else ``VM_DEFAULT_MINUTES`` from now; at most the longest
    time the quota allows) and counts against the owner's quotas (``quotas.check_locked``).
    ``ssh_key``: a public key the guest lets the owner in with (a reservation's VM is given
    the reservation's login instead). ``depends``: jobs to wait for before building (those
    suspending runs to make room on the claim's host: ``[(job id, [])]``, any end).
    ``variant``: the id of the image's variant for the claim's host, when the caller knows it
    (its build then need not pick it; ``opcodes.common.keeps_variant``). ``revision``: the
    image's revision to build it from (a template's, one under test); None: production.
    """
    errors = {}
    now = timezone.now()
    adhoc = allocation is None
    limited = adhoc and owner is not None and not access.is_admin(owner)
    if adhoc and end is not None and end <= now:
        errors["end"] = ["the end is in the past"]
    elif limited and end is None:
        end = now + timedelta(minutes=min(settings.VM_DEFAULT_MINUTES, quotas.limits_for(owner, image).max_minutes))
    if checked:
        pass  # the caller has just validated the image for this owner (``reservations.reserve``)
    elif owner is not None and not visible_images(owner).filter(pk=image.pk).exists():
        errors["image"] = ["no such image, or you may not use it"]
    elif not image.active:
        errors["image"] = [f"image {image.name} is inactive"]
    elif not image.variants.production().exists():
        errors["image"] = [f"image {image.name} has no variant for any hypervisor"]
    size = size_for(image, vcpus, memory_mib, disk_gib)
    for field, low in (
        ("vcpus", image.min_vcpus),
        ("memory_mib", image.min_memory_mib),
        ("disk_gib", image.min_disk_gib),
    ):
        if size[field] < low:
            errors[field] = [f"{image.name} needs at least {low}"]
    if allocation is not None and allocation.released is not None:
        errors["allocation"] = ["this allocation was released"]
    if limited and not errors:
        errors = quotas.check(owner, image, now, end, size, when_field=NON_FIELD_ERRORS)
    if errors:
        raise ValidationError(errors)
    with transaction.atomic(savepoint=savepoint):
        if limited:  # counted again under the quota locks, in the transaction that records the VM
            quotas.check_locked(owner, image, now, end, size, when_field=NON_FIELD_ERRORS)
        vm = VM.objects.create(
            name=name,
            image=image,
            owner=owner,
            end=end,
            allocation=allocation,
            adhoc=adhoc,
            ssh_key=ssh_key.strip(),
            variant_id=variant,
            revision=revision,
            **size,
        )
        changelog.record(vm, "create", actor, reason=reason or "requested")
        _emit(vm)
        job = jobs.submit(
            "vm.create",
            {"vm": vm.pk},
            actor=actor,
            submitter=owner,
            reason=reason or f"create {vm.key}",
            savepoint=False,
            depends=depends,
        )
    return vm, job


def has_clean_snapshot(vm):
    """The VM has the clean snapshot ``vm.create`` takes before the first boot (one taken
    later, by an older vclmgr, would hold its first user's login: never reused)."""
    return any(s.get("name") == CLEAN_SNAPSHOT and s.get("state") == VM.State.STOPPED for s in vm.snapshots or [])


def has_warm_snapshot(vm):
    """The VM has a warm snapshot: booted, its guest answering, nothing of anyone's in it yet (taken
    by a run's job on a pooled image's new VM, which is seeded with no login): a run on it
    starts by reverting there, without a boot."""
    return any(s.get("name") == WARM_SNAPSHOT and s.get("state") == VM.State.RUNNING for s in vm.snapshots or [])


PARKED_CLAIM = "parked "  # how a parked VM's disk-only claim's purpose begins


def is_parked_claim(allocation):
    """Is this the disk-only claim of a parked VM (which no one may run it on)?"""
    return allocation is not None and allocation.purpose.startswith(PARKED_CLAIM)


KEPT_CLAIM = "kept "  # a failed run's VM kept stopped for inspection: disk only, never pooled


def is_kept_claim(allocation):
    """Is this the disk-only claim of a VM kept stopped for inspection (``keep_stopped``)?"""
    return allocation is not None and allocation.purpose.startswith(KEPT_CLAIM)


SUSPENDED_CLAIM = "suspended "  # a VM suspended to disk to make room: only its disk is claimed


def is_suspended_claim(allocation):
    """Is this the disk-only claim of a VM suspended to make room (``suspend_claim``)?"""
    return allocation is not None and allocation.purpose.startswith(SUSPENDED_CLAIM)


def suspend_claim(vm_id, reason, *, actor):
    """Give back a VM's CPU and memory and keep its disk claimed: it is being suspended to disk
    to make room for work of a higher class. Its state is left to whoever suspends it (a run's
    job, after the hypervisor did); ``run_refusal`` keeps anyone else from resuming it."""
    with transaction.atomic():  # hosts first, then the VM row: the order claims lock them in
        vm = VM.objects.select_related("allocation").get(pk=vm_id)
        held = vm.allocation
        if is_suspended_claim(held) and held.released is None:
            return held
        claimed = capacity.claim_disk(
            vm.host_id, vm.disk_gib, purpose=f"{SUSPENDED_CLAIM}{vm.key}", actor=actor, replaces=held
        )
        set_state(vm_id, vm.state, reason, allocation=claimed, actor=actor)
    return claimed


def resume_claim(vm_id, end, reason, *, actor):
    """Claim a suspended VM's whole size back on its host until ``end`` (its disk claim
    replaced in the same transaction); ``NoCapacity`` changes nothing."""
    with transaction.atomic():
        vm = VM.objects.select_related("allocation", "host", "image").get(pk=vm_id)
        held = vm.allocation
        size = {"vcpus": vm.vcpus, "memory_mib": vm.memory_mib, "disk_gib": vm.disk_gib}
        demand = demand_for(vm.image, size, start=timezone.now(), end=end, purpose=f"vm {vm.pk}", prefer_cached=False)
        if held is not None:
            capacity.release(held, actor=actor, reason=f"{vm.key}: {reason}"[:500])
        claimed = capacity.claim_on_host(vm.host, demand, actor=actor, owner=vm.owner)
        set_state(vm_id, vm.state, reason, allocation=claimed, end=end, actor=actor)
    return claimed


def park(vm_id, reason, *, actor):
    """A VM waiting on its host for its next user, owned by no one: its disk stays there, so
    its claim is replaced by one for that disk alone, with no end, until it is reused or
    destroyed (``run_refusal`` will not let it run on that claim)."""
    return _on_disk_claim(vm_id, reason, PARKED_CLAIM, actor=actor, owner=None)


def keep_stopped(vm_id, reason, *, actor):
    """A stopped VM kept on its host for inspection (a failed run's) until it is destroyed: its
    claim becomes one for its disk alone, as a parked VM's, but it stays its owner's and is
    never in a pool (``parked`` looks for parked claims only); ``run_refusal`` keeps it off."""
    return _on_disk_claim(vm_id, reason, KEPT_CLAIM, actor=actor)


def _on_disk_claim(vm_id, reason, prefix, *, actor, **fields):
    with transaction.atomic():  # hosts first, then the VM row (set_state): the order claims lock them in
        vm = VM.objects.select_related("allocation").get(pk=vm_id)
        held = vm.allocation
        if not (held is not None and held.purpose.startswith(prefix) and held.released is None):
            fields["allocation"] = capacity.claim_disk(
                vm.host_id, vm.disk_gib, purpose=f"{prefix}{vm.key}", actor=actor, replaces=held
            )
        return set_state(vm_id, VM.State.STOPPED, reason, **fields, actor=actor)


def parked(image, host=None, size=None):
    """VMs of ``image`` (on ``host``, of ``size``, when given) waiting for a next user: back at
    their clean snapshot (``vm.park``), stopped, on their parked claim (or none: parked before
    there was one)."""
    rows = VM.objects.filter(image=image, state=VM.State.STOPPED, **(size or {}))
    # A VM of a revision no longer production is not handed to a next user: new users get production.
    rows = rows.filter(Q(revision__isnull=True) | Q(revision__state=revisions.State.PRODUCTION))
    if host is not None:
        rows = rows.filter(host=host)
    return rows.filter(
        Q(allocation__isnull=True)
        | Q(allocation__released__isnull=False)
        | Q(allocation__purpose__startswith=PARKED_CLAIM)
    ).order_by("pk")


def reuse_parked(*, actor, owner, image, size, allocation, name="", end=None, reason="", depends=()):
    """Hand a parked VM on ``allocation``'s host to ``owner`` on that claim and submit the
    ``vm.reuse`` job that reseeds and boots it (after the jobs ``depends`` names, if any);
    ``(vm, job)``, or None when no VM is parked there. Of two callers racing for one VM, one
    gets it (a conditional UPDATE)."""
    for vm in parked(image, allocation.host, size)[:5]:
        if not has_clean_snapshot(vm):
            continue
        with transaction.atomic():
            if not take_parked(vm, actor=actor, owner=owner, allocation=allocation, name=name, end=end, reason=reason):
                continue
            job = jobs.submit(
                "vm.reuse",
                {"vm": vm.pk},
                actor=actor,
                submitter=owner,
                reason=reason or f"reuse {vm.key}",
                depends=depends,
            )
        return vm, job
    return None


def take_parked(vm, *, actor, owner, allocation, name="", end=None, reason=""):
    """Give the parked ``vm`` to ``owner`` on ``allocation`` (a claim on its host), releasing
    its parked claim; False when someone else took it first (a conditional UPDATE). ``vm`` is
    refreshed. Booting it is the caller's (``opcodes.reuse.bring_up``)."""
    with transaction.atomic():
        taken = VM.objects.filter(pk=vm.pk, state=VM.State.STOPPED, allocation_id=vm.allocation_id).update(
            allocation=allocation,
            owner=owner,
            end=end,
            name=name or vm.name,
            error="",
            ssh_key="",
            updated=timezone.now(),
        )
        if not taken:
            return False
        if is_parked_claim(vm.allocation):  # the new claim counts its disk from now
            capacity.release(vm.allocation, actor=actor, reason=f"{vm.key} reused")
        vm.refresh_from_db()
        changelog.record(vm, "update", actor, {"owner": [None, getattr(owner, "pk", None)]}, reason or "reused")
        _emit(vm)
    return True


def pool_room(vm):
    """May ``vm`` (a finished run's) join its image's pool on its host? The image pools (a
    public one with a pool size), the VM can go back to its clean snapshot, nothing went wrong
    with it, and the pool there is below its size. Read again under a lock by ``park_in_pool``."""
    image = vm.image
    if not image.pool_size or pool_refusal(image.visibility, image.pool_size):
        return False
    if vm.state not in (VM.State.RUNNING, VM.State.STOPPED, VM.State.SUSPENDED) or vm.error:
        return False
    if not has_clean_snapshot(vm) or vm.host_id is None:
        return False
    return parked(image, vm.host).exclude(pk=vm.pk).count() < image.pool_size


def park_in_pool(vm_id, reason, *, actor):
    """Park a rolled-back run VM in its image's pool (``park``) if the pool on its host still
    has room, counted under the image's row lock so that two runs ending at once never fill it
    past its size; False (nothing changed): the caller destroys the VM."""
    with transaction.atomic():
        vm = VM.objects.select_related("image").get(pk=vm_id)
        image = Image.objects.select_for_update().get(pk=vm.image_id)
        if not image.pool_size or pool_refusal(image.visibility, image.pool_size):
            return False
        if parked(image, vm.host).exclude(pk=vm_id).count() >= image.pool_size:
            return False
        park(vm_id, reason, actor=actor)
    return True


def size_for(image, vcpus=None, memory_mib=None, disk_gib=None):
    """A VM's size: what is asked, else the image's defaults (a disk of 0 GiB is asked for)."""
    return {
        "vcpus": vcpus or image.default_vcpus,
        "memory_mib": memory_mib or image.default_memory_mib,
        "disk_gib": disk_gib if disk_gib is not None else image.default_disk_gib,
    }


def demand_for(
    image,
    size,
    *,
    start,
    end,
    purpose,
    hypervisors=None,
    exclude_hosts=(),
    prefer_cached=True,
    usable=None,
    gpus=0,
    gpu_model="",
):
    """The placement ``Demand`` of one VM of ``image`` and ``size`` over ``[start, end)``.

    The one builder for VMs and reservations: the image's required and forbidden host tags, its
    anti-affinity group and its need for exclusive storage go with it, so every claim honours
    them. ``hypervisors``: the hypervisor types of the variants the VM can run from (default:
    every variant's: a host runs only an image with a variant of its type);
    ``exclude_hosts``: host ids it must not go to; ``prefer_cached``: try the hosts that have
    the image staged first. ``usable``: the image's ``usable`` as the caller just read it (its
    variants and staged hosts are not read again). ``gpus``: that many GPUs of ``gpu_model``, or
    of any one model when it is blank (``placement.devices``).
    """
    if hypervisors is None:
        variants = usable.variants if usable is not None else None
        hypervisors = variants or variant_types(image)
    staged = frozenset()
    if prefer_cached:
        staged = usable.staged if usable is not None else hosts_with(image)
    return capacity.Demand(
        vcpus=size["vcpus"],
        memory_mib=size["memory_mib"],
        disk_gib=size["disk_gib"],
        start=start,
        end=end,
        hypervisors=frozenset(hypervisors),
        purpose=purpose,
        exclude_hosts=frozenset(exclude_hosts),
        prefer_hosts=staged,
        image=image.name,
        required_tags=frozenset(image.required_tags),
        forbidden_tags=frozenset(image.forbidden_tags),
        anti_affinity=image.anti_affinity,
        exclusive_storage=image.exclusive_storage,
        extras=devices.gpus({gpu_model: gpus}) if gpu_model else {},
        gpus_any=0 if gpu_model else gpus,
    )


def vm_demand(vm, *, purpose, **options):
    """The demand of an existing VM, from now to its end (``options`` as for ``demand_for``);
    a VM built from a revision runs on the hypervisor types that revision has variants for, and
    a VM whose claim holds GPUs asks for them again (its new claim is built or moved with them)."""
    size = {"vcpus": vm.vcpus, "memory_mib": vm.memory_mib, "disk_gib": vm.disk_gib}
    if vm.revision_id and options.get("hypervisors") is None:
        options["hypervisors"] = variant_types(vm.image, vm.revision_id)
    if vm.allocation_id and "gpus" not in options:
        options.update(claimed_gpu_ask(vm.allocation))
    return demand_for(vm.image, size, start=timezone.now(), end=vm.end, purpose=purpose, **options)


def claimed_gpu_ask(allocation):
    """The GPUs a claim holds as ``demand_for`` asks for them (``{}``: none). A VM's GPUs are
    of one model (``placement.devices``)."""
    for name, count in sorted(allocation.extras.items()):
        model = devices.model_of(name)
        if model and count:
            return {"gpus": int(count), "gpu_model": model}
    return {}


def submit_action(vm, action, *, actor, reason="", submitter=None, depends=(), **params):
    """Submit the job for a VM action (start, stop, suspend, resume, destroy, snapshot, revert,
    migrate, capture). ``capture`` takes ``image_name`` (a new image's name) and ``force``;
    ``depends``: jobs that must succeed first (a restart is a stop, then a start)."""
    if vm.state == VM.State.DESTROYED:
        raise Conflict(f"{vm} is destroyed")
    refusal = run_refusal(vm, action)
    if refusal:
        raise Conflict(refusal)
    if action in NEEDS_BUILT and vm.state not in (
        VM.State.RUNNING,
        VM.State.STOPPED,
        VM.State.SUSPENDED,
    ):
        raise Conflict(f"cannot {action} {vm}: it is {vm.state}")
    if action == "capture":
        # A new revision of an image keeps its name; only a new image's must be free.
        _check_capture_name(params.get("image_name"), new=params.get("image") is None)
    actor = Actor.of(actor)
    return jobs.submit(
        f"vm.{action}",
        {"vm": vm.pk, **params},
        actor=actor,
        submitter=submitter or actor.user or vm.owner,
        reason=reason or f"{action} {vm.key}",
        depends=depends,
    )


def run_refusal(vm, action, now=None):
    """Why ``vm`` may not be powered on by ``action`` now, or None. A VM runs only on a live
    claim (one reverted at its reservation's end stays defined, its claim given back) and
    only until its end; a revert may bring a running snapshot back, so it needs the claim too."""
    if action not in POWER_ON:
        return None
    allocation = vm.allocation
    if allocation is None or allocation.released is not None:
        return f"{vm} holds no claim on a host any more (its time is over): it cannot run; request a new one"
    if is_parked_claim(allocation):
        return f"{vm} is parked for its next user (only its disk is claimed): it cannot run; request a new one"
    if is_kept_claim(allocation):
        return f"{vm} is kept stopped for inspection (only its disk is claimed): it cannot run"
    if is_suspended_claim(allocation):
        return f"{vm} is suspended to make room for work of a higher class: its run resumes it when room returns"
    if action != "revert" and vm.end is not None and vm.end <= (now or timezone.now()):
        ended = timezone.localtime(vm.end)
        return f"{vm}'s time ended at {ended:%Y-%m-%d %H:%M %Z}: it cannot run again; request a new one"
    return None


def overdue_vms(now=None):
    """Ad-hoc VMs whose end has passed and that still exist (or may): the VM clock ends them."""
    return VM.objects.filter(adhoc=True, end__lte=now or timezone.now(), state__in=(VM.State.REQUESTED, *VM.LIVE))


def end_overdue(now=None, *, actor):
    """Submit ``vm.destroy`` for each overdue ad-hoc VM that has none pending, running or tried
    in the last ``END_RETRY`` (a host that cannot destroy is asked again, not every minute).
    Its claim is released by that job once the VM is gone, and counted until then."""
    now = now or timezone.now()
    overdue = list(overdue_vms(now).values_list("pk", flat=True))
    recent = Q(status__in=(*Job.PENDING, Job.Status.RUNNING)) | Q(received__gt=now - END_RETRY)
    busy = set(
        Job.objects.filter(recent, opcode="vm.destroy", params__vm__in=overdue).values_list("params__vm", flat=True)
    )
    submitted = 0
    for pk in overdue:
        if pk not in busy:
            jobs.submit("vm.destroy", {"vm": pk}, actor=actor, reason=f"{vm_key(pk)}: its time is over")
            submitted += 1
    return {"overdue": len(overdue), "submitted": submitted}


def _check_capture_name(name, new=True):
    try:
        base.check_image_name(name)
    except base.DriverError as exc:
        raise ValidationError({"image_name": [str(exc)]}) from None
    if new and Image.objects.filter(name=name).exists():
        raise ValidationError({"image_name": [f"an image named {name} exists already"]})


# What the VM opcodes read with a VM (``load_vm``, ``set_state``'s result): one query, no more.
# (The claim's host with its credential: an adopted claim's VM goes on to define with that host.)
LOADED = ("host", "host__credential", "image", "variant", "variant__image", "allocation", "allocation__host",
          "allocation__host__credential")  # fmt: skip


def set_state(vm_id, state, reason="", *, actor, known=None, **fields):
    """Record a VM's new state (and fields such as host, address, error); emits ``vm.changed``.
    Returns the VM as written, with what ``LOADED`` names (a step goes on from it, no read again).

    ``known``: the VM as the caller (a job's run, which holds the VM's lock) last read or wrote
    it, with what ``LOADED`` names; it is written from that, with no read, if the row still
    has its known values (``_write_known``), else read again as without it.

    In a caller's transaction it adds no savepoint (it catches nothing, so it needs none). In a
    job's run it writes the step records the run keeps (``kept_records``): a step that starts
    with a state change needs no transaction for the record of the step before it."""
    with transaction.atomic(savepoint=False), kept_records.carrying():
        written = _write_known(known, state, reason, actor, fields) if known is not None else None
        if written is not None:
            return written
        vm = VM.objects.select_for_update(of=("self",)).select_related(*LOADED).get(pk=vm_id)
        before = {"state": vm.state, **{name: getattr(vm, name) for name in fields}}
        vm.state = state
        for name, value in fields.items():
            setattr(vm, name, value)
        after = {"state": state, **fields}
        changes = changelog.diff(before, after, list(after))
        if changes:
            vm.save()
            changelog.record(vm, "update", actor, changes, reason)
            _emit(vm)
    return vm


# What a known VM's row must still hold for ``set_state`` to write from it without a read (with
# the old values of the fields it writes): its state, and where and on what claim it runs.
KNOWN = ("state", "host_id", "variant_id", "allocation_id", "target_allocation_id")


def _write_known(vm, state, reason, actor, fields):
    """``set_state`` from ``vm`` as known, by one UPDATE conditional on the row still holding
    the known values of ``KNOWN`` and of the fields written (so the change log's old values are
    the row's); the fields not written are left as they are in the row. Returns ``vm`` as
    written, or None (the row differs, nothing would change, or a JSON field: read it)."""
    columns = [VM._meta.get_field(name) for name in fields]
    if any(column.get_internal_type() == "JSONField" for column in columns):
        return None
    before = {"state": vm.state, **{name: getattr(vm, name) for name in fields}}
    after = {"state": state, **fields}
    changes = changelog.diff(before, after, list(after))
    if not changes:
        return None
    now = timezone.now()
    where = {name: getattr(vm, name) for name in {*KNOWN, *(column.attname for column in columns)}}
    if not VM.objects.filter(pk=vm.pk, **where).update(state=state, updated=now, **fields):
        return None
    vm.state, vm.updated = state, now
    for name, value in fields.items():
        setattr(vm, name, value)
    changelog.record(vm, "update", actor, changes, reason)
    _emit(vm)
    return vm


def set_tags(vm, tags, *, actor, reason=""):
    """Replace a VM's tags (free labels; Ganeti's instance tags). ``ValidationError`` on a bad
    name. Returns True when they changed."""
    try:
        tags = clean_tags(tags)
    except ValueError as exc:
        raise ValidationError({"tags": [str(exc)]}) from None
    with transaction.atomic():
        locked = VM.objects.select_for_update().get(pk=vm.pk)
        before = sorted(locked.tags.names())
        if before == tags:
            return False
        locked.tags.set(tags, clear=True)
        changelog.record(locked, "update", actor, {"tags": [before, tags]}, reason)
    return True


def rename_vm(vm_id, name, *, actor, reason=""):
    """Give a VM another name (a label: the drivers know it by its key, so nothing on the host
    changes). Names are unique among the VMs that are not destroyed. Returns True when it changed."""
    if not name or len(name) > 100 or not name.isprintable():
        raise ValidationError({"name": ["a printable name of 1 to 100 characters"]})
    with transaction.atomic():
        vm = VM.objects.select_for_update().get(pk=vm_id)
        if vm.name == name:
            return False
        if VM.objects.exclude(state=VM.State.DESTROYED).exclude(pk=vm.pk).filter(name=name).exists():
            raise Conflict(f"a VM named {name!r} already exists")
        before, vm.name = vm.name, name
        vm.save(update_fields=["name", "updated"])
        changelog.record(vm, "update", actor, {"name": [before, name]}, reason)
    _emit(vm)
    return True


def cleanup_failed(vm_id, reason, *, actor):
    """A VM that may still be on its host although removing it failed (the driver's destroy
    raised, the host did not answer) or a migration lost track of where it is: state
    ``error`` with the reason, and its claims kept with no end (``capacity.hold``), so its
    room is never counted as free. Only a vm.destroy that succeeds (the driver removed it, or
    says it is not there) releases them."""
    with transaction.atomic():  # hosts first, then the VM row (set_state): the order claims lock them in
        vm = VM.objects.get(pk=vm_id)
        held = {}
        for name in ("allocation", "target_allocation"):
            allocation = getattr(vm, name)
            if allocation is not None:
                held[name] = capacity.hold(allocation, actor=actor, reason=f"{vm.key}: {reason}")
        return set_state(vm_id, VM.State.ERROR, "cleanup failed", error=reason[:4000], **held, actor=actor)


def fail_build(vm_id, reason, note, *, actor):
    """A build that left nothing on any host (never defined there, or removed by its undo): the
    VM's claim goes back and it is ``failed`` with the reason (``note``: the history line), in
    one transaction. Nothing is asked of a hypervisor."""
    with transaction.atomic():
        vm = VM.objects.select_related("allocation").get(pk=vm_id)
        if vm.allocation is not None:
            capacity.release(vm.allocation, actor=actor, reason=f"{vm.key}: {note}")
        return set_state(vm_id, VM.State.FAILED, note, error=reason[:4000], address=None, actor=actor)


def _emit(vm):
    data = {"id": vm.pk, "key": vm.key, "state": vm.state, "host": vm.host_id, "address": vm.address, "error": vm.error}
    targets = [f"vm.{vm.pk}", "admin"] + ([topics.user_topic(vm.owner_id)] if vm.owner_id else [])
    events.emit("vm.changed", data, targets)


emit_vm = _emit  # for a VM row written outside these functions (adopted by verify/repair)


def mark_lost(vm_id, reason, *, actor):
    """Its host died (offline after failed checks): the VM is ``lost`` and its claims are
    released, since nothing is placed on an offline host. The row stays, with its host, so
    that verify shows the VM if the host returns and the destroy repair removes it."""
    with transaction.atomic():
        vm = VM.objects.select_related("allocation", "target_allocation").get(pk=vm_id)
        for allocation in (vm.allocation, vm.target_allocation):
            if allocation is not None:
                capacity.release(allocation, actor=actor, reason=f"{vm.key}: {reason}"[:500])
        return set_state(vm_id, VM.State.LOST, reason, error=reason[:4000], actor=actor)


# --- host image cache -------------------------------------------------------------------


def prestage_targets(image_id, group_id):
    """Online hosts of the group that can run the image and do not have it staged yet."""
    from inventory.models import Hypervisor

    image = Image.objects.get(pk=image_id)
    types = variant_types(image)
    hosts = Hypervisor.objects.filter(group_id=group_id, state=Hypervisor.State.ONLINE).exclude(
        pk__in=hosts_with(image)
    )
    return [h.pk for h in hosts.order_by("pk") if registry.serves(h.hypervisor_type, types)]


def prestage(image, group, at=None, reason="", *, actor):
    """Stage ``image`` onto the ``group``'s hosts now (returns the job) or at ``at`` (returns the
    django-q2 Schedule that will submit it then), e.g. an hour before a class starts."""
    errors = {}
    if not image.variants.production().exists():
        errors["image"] = [f"image {image.name} has no variant to stage"]
    if at is not None and at < timezone.now():
        errors["at"] = ["the time is in the past"]
    if errors:
        raise ValidationError(errors)
    reason = reason or f"pre-stage {image.name} on group {group.name}"
    if at is None:
        return jobs.submit("image.prestage", {"image": image.pk, "group": group.pk}, actor=actor, reason=reason)
    from django_q.models import Schedule

    return Schedule.objects.create(
        name=f"prestage {image.name} on {group.name} at {at:%Y-%m-%d %H:%M}"[:100],
        func="provisioning.tasks.submit_prestage",
        args=f"{image.pk},{group.pk}",
        schedule_type=Schedule.ONCE,
        next_run=at,
        repeats=1,
    )


def hosts_with(image):
    """Ids of the hosts that have one of the production variants of the image staged
    (placement tries them first)."""
    staged = HostImage.objects.filter(variant__in=image.variants.production(), state=HostImage.State.STAGED)
    return frozenset(staged.values_list("host_id", flat=True))


def variant_types(image, revision_id=None):
    """The hypervisor types of the image's variants: the production revision's, or those of
    the revision ``revision_id`` (a VM's own)."""
    rows = image.variants.filter(revision_id=revision_id) if revision_id else image.variants.production()
    return frozenset(rows.values_list("hypervisor_type", flat=True))


def cached(host, variant):
    return HostImage.objects.filter(host=host, variant=variant, state=HostImage.State.STAGED).first()


def vms_on(host):
    """VMs that exist (or may) on the host: what blocks deleting it."""
    return VM.objects.filter(host=host, state__in=VM.LIVE)


def in_use_reason(host):
    count = vms_on(host).count()
    return f"{count} VMs on it" if count else None


def image_types(name, user=None):
    """The hypervisor types of the image ``name`` that ``user`` may use (capacity's what-if
    placement asks through ``capacity.services.IMAGE_TYPES``); LookupError otherwise."""
    images = Image.objects if user is None else Image.objects.visible_to(user)
    image = images.filter(name=name).first()
    if image is None:
        raise LookupError(f"no image named {name!r}")
    return variant_types(image)
