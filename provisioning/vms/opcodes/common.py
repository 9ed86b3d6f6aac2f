"""What every opcode of the VM app shares: loading and authorising the VM, failure wording,
the variant a host runs."""

from django.db.models import Exists, OuterRef

from provisioning.capacity import services as capacity
from provisioning.drivers import base
from provisioning.jobs.runner import Handoff, LeaseLost
from provisioning.vms import services
from provisioning.vms.models import VM, HostImage
from vclmgr import access

S = VM.State
POLL_SECONDS = 0.2


class Refused(Exception):
    """The job may not do this (wrong owner, wrong state, no variant for the host)."""


def load_vm(vm_id):
    """The VM with what the opcodes read of it in one query (its host, image, variant, claim)."""
    return VM.objects.select_related(*services.LOADED).get(pk=vm_id)


def authorised_vm(job):
    """The job's VM (``params["vm"]``) if its submitter may act on it. Another user's VM is
    refused in the words used for a missing one, so job errors cannot probe for VM ids."""
    vm_id = job.params["vm"]
    try:
        vm = load_vm(vm_id)
    except VM.DoesNotExist:
        vm = None
    submitter = job.job.submitter_id  # read only when not the owner (an admin acting on another's VM)
    if vm is None or (submitter is not None and vm.owner_id != submitter and not access.is_admin(job.job.submitter)):
        raise Refused(f"VM {vm_id} does not exist")
    return vm


def fail_reason(exc):
    if isinstance(exc, capacity.NoCapacity):
        return f"no capacity: {exc}"
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, base.DriverError) else str(exc)


def passes_through(exc):
    """Exceptions that mean 'another worker continues this job': never clean up on them."""
    return isinstance(exc, (LeaseLost, Handoff)) or type(exc).__name__ == "TimeoutException"


def variant_for(vm, host, staged=False):
    """The image's variant for the host's hypervisor type; a host that runs any format (the
    simulator) takes another variant when the image has none of its own type. ``staged``: each
    variant is read with whether it is staged on the host (its ``staged_here``), in the same
    statement (the stage step that follows need not ask)."""
    rows = vm.image.variants.all()
    if staged:
        cached = HostImage.objects.filter(host=host, variant=OuterRef("pk"), state=HostImage.State.STAGED)
        rows = rows.annotate(staged_here=Exists(cached))
    variants = {v.hypervisor_type: v for v in rows}
    variant = variants.get(host.hypervisor_type)
    if variant is None and host.image_formats is None and variants:
        variant = next(iter(variants.values()))
    if variant is None:
        raise Refused(f"image {vm.image.name} has no variant for {host.hypervisor_type} host {host.name}")
    return variant
