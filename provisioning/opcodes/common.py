"""What every opcode of the VM app shares: loading and authorising the VM, failure wording,
the variant a host runs."""

from django.db.models import Exists, OuterRef

from accounts import access
from capacity import services as capacity
from core import reconnect
from drivers import base
from jobs.runner import Handoff, LeaseLost
from provisioning import services
from provisioning.models import VM, HostImage, ImageVariant
from provisioning.opcodes import guest

S = VM.State
POLL_SECONDS = 0.2


class Refused(Exception):
    """The job may not do this (wrong owner, wrong state, no variant for the host)."""


def load_vm(vm_id, building=False):
    """The VM with what the opcodes read of it in one query (its host, image, variant, claim).
    ``building``: with what its build reads besides, in the same query: whether its variant is
    staged on its claim's host (``variant_staged``) and its reservation's login
    (``guest.reservation_login``)."""
    rows = VM.objects.select_related(*services.LOADED)
    if building:
        cached = HostImage.objects.filter(
            host=OuterRef("allocation__host"), variant=OuterRef("variant"), state=HostImage.State.STAGED
        )
        rows = rows.annotate(variant_staged=Exists(cached), reservation_login=guest.reservation_login())
    return rows.get(pk=vm_id)


def keeps_variant(vm, host):
    """Does the variant the VM was given (by its reservation, which knew its claim's host) suit
    ``host``? (A claim moved to a host of another type since needs another.)"""
    return (
        vm.variant is not None
        and vm.variant.revision_id == (vm.revision_id or vm.variant.revision_id)  # one of its own revision's
        and services.pick_variant({vm.variant.hypervisor_type: vm.variant}, host.hypervisor_type) is not None
    )


def authorised_vm(job, building=False):
    """The job's VM (``params["vm"]``) if its submitter may act on it. Another user's VM is
    refused in the words used for a missing one, so job errors cannot probe for VM ids.
    ``building``: see ``load_vm``."""
    vm_id = job.params["vm"]
    try:
        vm = load_vm(vm_id, building)
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
    """Exceptions that mean 'this job goes on elsewhere': another worker, a fresh task, or the
    queue again after its database session was lost (``runner``). Never clean up on them: a
    job given up after its last attempt leaves what it made to its settle (a reservation's) or
    to verify and repair."""
    return (
        isinstance(exc, (LeaseLost, Handoff)) or type(exc).__name__ == "TimeoutException" or reconnect.session_lost(exc)
    )


def variant_for(vm, host, staged=False):
    """The image's variant for the host's hypervisor type (``services.pick_variant``: none of
    another type, unless a simulated host is told to run any image), of the VM's own revision
    (a rebuild keeps it), else of the production revision (a new VM). ``staged``: each
    variant is read with whether it is staged on the host (its ``staged_here``), in the same
    statement (the stage step that follows need not ask)."""
    rows = ImageVariant.objects.filter(image_id=vm.image_id)
    rows = rows.filter(revision_id=vm.revision_id) if vm.revision_id else rows.production()
    if staged:
        cached = HostImage.objects.filter(host=host, variant=OuterRef("pk"), state=HostImage.State.STAGED)
        rows = rows.annotate(staged_here=Exists(cached))
    variant = services.pick_variant({v.hypervisor_type: v for v in rows}, host.hypervisor_type)
    if variant is None:
        raise Refused(f"image {vm.image.name} has no variant for {host.hypervisor_type} host {host.name}")
    return variant
