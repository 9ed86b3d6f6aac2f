"""``vm.capture``: a stopped VM's disk saved as a new image derived from the VM's image, or
(``image`` given: an image's template published) as a new revision of that image."""

from django.contrib.auth import get_user_model
from django.db import transaction

from accounts import access
from drivers import registry as drivers
from jobs.registry import opcode
from provisioning import revisions, services
from provisioning.models import Image, ImageRevision
from provisioning.opcodes.common import Refused, authorised_vm, load_vm
from provisioning.opcodes.lifecycle import power
from provisioning.opcodes.params import CaptureParams, capture_locks

# What a driver's captured image gives its variant: the disk, and the kernel settings of a VM
# that boots one directly (the driver copied its kernel and initrd beside the captured disk).
CAPTURED_FIELDS = ("format", "location", "checksum", "size_gib", *services.KERNEL_FIELDS)


@opcode("vm.capture", params=CaptureParams, locks=capture_locks, staff_only=False)
def vm_capture(job):
    """Capture a VM's disk as a new image (derived from the VM's image); the VM is stopped first.

    Every driver captures a stopped VM only, so a running VM is shut down (``force``: powered
    off) and left stopped. The new image is owned by the job's submitter, who may use it at
    once. Who else sees it is ``access.capture_access``'s: the parent's visibility and groups
    when an administrator (or the system) captures; an image maintainer's groups, restricted,
    for theirs; nobody else for anyone else's until a maintainer of their groups shares it.

    ``image``: the disk becomes a new revision of that image instead (testing, or production
    with ``production``), made from the VM's own revision; the submitter must maintain it.
    """
    vm = authorised_vm(job)
    name = job.params["image_name"]
    target = job.params.get("image")
    if target is not None:
        return _capture_revision(job, vm, target)
    if "capture" not in job._done and Image.objects.filter(name=name).exists():  # before stopping the VM
        raise Refused(f"an image named {name} exists already")
    job.expect(3)
    job.step("stop", power, vm.pk, "stop", job.params["force"], actor=job.actor)
    captured = job.step("capture", capture_on_host, vm.pk, name)
    visibility, groups = access.capture_access(job.job.submitter, vm.image)
    owner, comment = job.job.submitter_id, job.params.get("comment", "")
    image = job.step("register", register_capture, vm.pk, captured, visibility, groups, owner, comment, actor=job.actor)
    return {"vm": vm.pk, "image": image["image"], "variant": image["variant"], "name": name}


def _capture_revision(job, vm, image_id):
    image = Image.objects.filter(pk=image_id).first()
    if image is None or not access.can_maintain_image(job.job.submitter, image):
        raise Refused(f"image {image_id} does not exist or is not yours to change")
    job.expect(3)
    job.step("stop", power, vm.pk, "stop", job.params["force"], actor=job.actor)
    captured = job.step("capture", capture_on_host, vm.pk, job.params["image_name"])
    production, comment = job.params.get("production", False), job.params.get("comment", "")
    made = job.step("register", register_revision, vm.pk, captured, image.pk, production, comment, actor=job.actor)
    return {"vm": vm.pk, **made}


def register_revision(vm_id, captured, image_id, production, comment="", *, actor):
    """Record the captured disk as the next revision of image ``image_id`` (one variant, for the
    VM's host type), made from the VM's revision; production at once if asked. Idempotent: a
    revision an interrupted attempt recorded with this disk is the one returned."""
    vm = load_vm(vm_id)
    image = Image.objects.get(pk=image_id)
    fields = {"hypervisor_type": vm.host.hypervisor_type}
    fields.update((name, captured[name]) for name in CAPTURED_FIELDS if captured.get(name))
    variant = image.variants.filter(location=fields["location"]).select_related("revision").first()
    with transaction.atomic():
        if variant is None:
            parent = ImageRevision.objects.filter(pk=vm.revision_id, image=image).first()
            revision = services.add_revision(
                image,
                actor=actor,
                variants=[fields],
                parent=parent,
                comment=comment,
                reason=f"captured from {vm.key}",
            )
            variant = revision.variants.get()
        revision = variant.revision
        if production and revision.state != ImageRevision.State.PRODUCTION:
            revisions.make_production(revision, actor=actor, reason=f"published from {vm.key}")
    return {"image": image.pk, "variant": variant.pk, "revision": revision.number, "name": image.name}


def capture_on_host(vm_id, name):
    vm = load_vm(vm_id)
    return drivers.driver_for(vm.host).capture(vm.key, name).as_dict()


def register_capture(vm_id, captured, visibility, groups, owner_id=None, comment="", *, actor):
    """Record the captured image (owned by ``owner_id``) and its one variant (for the VM's host
    type) in the library; ``comment`` becomes its first revision's."""
    vm = load_vm(vm_id)
    parent = vm.image
    fields = {"hypervisor_type": vm.host.hypervisor_type}
    fields.update((name, captured[name]) for name in CAPTURED_FIELDS if captured.get(name))
    existing = Image.objects.filter(name=captured["name"], parent=parent).first()
    if existing is not None:  # recorded by an interrupted attempt
        variant = existing.variants.production().filter(hypervisor_type=fields["hypervisor_type"]).first()
        variant = variant or services.add_variant(existing, actor=actor, reason=f"captured from {vm.key}", **fields)
        return {"image": existing.pk, "variant": variant.pk}
    reason = f"captured from {vm.key}"
    with transaction.atomic():
        image = services.create_image(
            actor=actor,
            name=captured["name"],
            os=parent.os,
            platform=parent.platform,
            description=f"Captured from {vm} ({vm.key}) of {parent.name}.",
            min_vcpus=parent.min_vcpus,
            min_memory_mib=parent.min_memory_mib,
            min_disk_gib=parent.min_disk_gib,
            default_vcpus=vm.vcpus,
            default_memory_mib=vm.memory_mib,
            default_disk_gib=max(vm.disk_gib, parent.min_disk_gib),
            visibility=visibility,
            parent=parent,
            groups=groups,
            owner=get_user_model().objects.filter(pk=owner_id).first() if owner_id else None,
            reason=reason,
        )
        variant = services.add_variant(image, actor=actor, reason=reason, **fields)
        if comment:  # the revision was made with the image, in this transaction, by add_variant
            ImageRevision.objects.filter(pk=variant.revision_id).update(comment=comment)
    return {"image": image.pk, "variant": variant.pk}
