"""Image staging: a variant copied onto a host once, within the transfer limits; and removed
(``image.unstage``) when the revision it belongs to is deleted.

``VCLMGR_STAGE_PER_HOST`` / ``_PER_CHASSIS`` / ``_GLOBAL`` bound the copies running at once
(per host, per blade center, in all), so a mass boot waits for a slot instead of flooding the
network; a slot is taken under one global lock (``QueueSettings.lock``) so the limits hold
exactly, and a slot older than ``STAGE_STALE_SECONDS`` belongs to a dead worker.
"""

import time

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from drivers import base
from drivers import registry as drivers
from inventory.models import Hypervisor
from jobs.models import QueueSettings
from jobs.registry import opcode
from provisioning import services
from provisioning.models import VM, HostImage, Image
from provisioning.opcodes.common import POLL_SECONDS, load_vm, variant_for
from provisioning.opcodes.params import PrestageParams, StageParams, UnstageParams, host_lock

STAGE_STALE_SECONDS = 600  # a staging slot older than this belongs to a dead worker
STAGE_WAIT_SECONDS = 120


def stage(vm_id, host_id, job_id, loaded=None):
    """Get the VM's image variant onto the host (see ``stage_variant``). ``loaded``: the VM as
    the claim step wrote it (placed on the host, its variant picked), else it is read; a
    variant the claim read as staged there (``common.variant_for``) is not asked about again."""
    vm = loaded if loaded is not None and loaded.host_id == host_id and loaded.variant_id else load_vm(vm_id)
    host = vm.host if vm.host_id == host_id else Hypervisor.objects.select_related("credential").get(pk=host_id)
    if vm is loaded and getattr(vm.variant, "staged_here", False):  # read by this run's claim step just before
        return {"cached": True}
    return stage_variant(host, vm.variant, job_id)


def stage_variant(host, variant, job_id):
    """Copy a variant onto a host (its ``Hypervisor`` row, with its credential), once per host,
    within the transfer limits (per host, per chassis, in all): a mass boot waits for a slot
    instead of flooding the network."""
    if services.cached(host, variant):  # the common case, read without a write transaction (SQLite's lock)
        return {"cached": True}
    deadline = time.monotonic() + STAGE_WAIT_SECONDS
    while True:
        turn = _take_stage_slot(host, variant, job_id)
        if turn == "staged":
            return {"cached": True}
        if turn == "mine":
            break
        if time.monotonic() > deadline:
            raise base.DriverError(
                f"no image transfer slot on {host.name} within {STAGE_WAIT_SECONDS} s", permanent=False
            )
        time.sleep(POLL_SECONDS)
    try:
        location = drivers.driver_for(host).stage_image(services.spec(variant))
    except Exception as exc:
        HostImage.objects.filter(host=host, variant=variant, staging_job=job_id).update(
            state=HostImage.State.FAILED, error=str(exc)[:2000], staging_job=None
        )
        raise
    HostImage.objects.filter(host=host, variant=variant).update(
        state=HostImage.State.STAGED, location=location[:1000], staged_at=timezone.now(), staging_job=None, error=""
    )
    return {"cached": False, "location": location}


def _take_stage_slot(host, variant, job_id):
    """'staged' (cached already), 'mine' (copy it now) or None (wait: busy, or being copied)."""
    now = timezone.now()
    fresh = now - timezone.timedelta(seconds=STAGE_STALE_SECONDS)
    with transaction.atomic():
        # One slot-taker at a time in all, so the chassis and global limits hold exactly; slots
        # are taken once per image and host, so this lock is rarely waited for.
        QueueSettings.lock()
        row, _ = HostImage.objects.get_or_create(host=host, variant=variant, defaults={"state": HostImage.State.FAILED})
        if row.state == HostImage.State.STAGED:
            return "staged"
        if row.state == HostImage.State.STAGING and row.staging_job != job_id and row.started and row.started > fresh:
            return None  # someone else is copying it: wait for their copy
        busy = HostImage.objects.filter(state=HostImage.State.STAGING, started__gt=fresh).exclude(pk=row.pk)
        if busy.filter(host=host).count() >= settings.VCLMGR_STAGE_PER_HOST:
            return None
        chassis = host.blade_center_id
        if chassis and busy.filter(host__blade_center_id=chassis).count() >= settings.VCLMGR_STAGE_PER_CHASSIS:
            return None  # the chassis' uplink is shared by all its blades
        if busy.count() >= settings.VCLMGR_STAGE_GLOBAL:
            return None
        HostImage.objects.filter(pk=row.pk).update(state=HostImage.State.STAGING, staging_job=job_id, started=now)
        return "mine"


@opcode("image.stage", params=StageParams, locks=host_lock, staff_only=True)
def image_stage(job):
    """Copy an image's variant for the host's type onto one host (within the transfer limits)."""
    image = Image.objects.get(pk=job.params["image"])
    host = Hypervisor.objects.select_related("credential").get(pk=job.params["hypervisor"])
    probe = VM(image=image)
    variant = variant_for(probe, host)
    return job.step("stage", stage_variant, host, variant, job.job_id)


@opcode("image.unstage", params=UnstageParams, locks=host_lock, staff_only=True)
def image_unstage(job):
    """Remove a deleted revision's copy from a host (``revisions.delete_revision`` submits it
    after the copy's cache row is gone, so no new VM can pick it meanwhile)."""
    host = Hypervisor.objects.select_related("credential").get(pk=job.params["hypervisor"])
    location = job.params["location"]
    if HostImage.objects.filter(host=host, location=location).exists():  # staged again since, for another variant
        return {"removed": False, "note": "in use again"}
    return {"removed": job.step("unstage", _unstage, host, location)}


def _unstage(host, location):
    return drivers.driver_for(host).unstage_image(location)


@opcode("image.prestage", params=PrestageParams, staff_only=True)
def image_prestage(job):
    """Stage an image onto every online host of a node group ahead of a known start (one
    ``image.stage`` child per host that can run it and lacks it)."""
    image = Image.objects.get(pk=job.params["image"])
    hosts = job.step("hosts", services.prestage_targets, image.pk, job.params["group"])
    children = [job.submit_child("image.stage", {"image": image.pk, "hypervisor": h}, key=f"host-{h}") for h in hosts]
    return {"image": image.pk, "hosts": hosts, "jobs": children}
