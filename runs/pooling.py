"""The public pool of run VMs (after the DRM article's public VMs and secure rollback).

An image with a ``pool_size`` above 0 (public images only: ``vms.pool_refusal``) keeps up to
that many VMs per host for its next runs. A run whose command ran to its end (any exit status,
or killed by its time limit or a cancel) has its VM rolled back to the clean snapshot taken
before its first boot and parked there (``opcodes.reuse.roll_back``, ``vms.park_in_pool``: the
same steps and claim as a ``revert_on_end`` reservation's VM, a disk-only claim while it waits).
A failed build, or a fault of the VM, its guest or its host, is never pooled: that VM is
destroyed. The next run of the image and size takes a parked VM on a host where it fits
(``take``, with a claim there) and boots it with a fresh seed (``opcodes.reuse.bring_up``).

Warm: a pooled image's new run VM, once booted and answering and before anything of its run
goes in, gets a second snapshot, running, memory included (``warm_up``: the ``warm`` step of
``run.execute``). A run's VM is seeded with no login (it is driven through the guest command
channel), so that snapshot holds no one's secrets or files. Parked, the VM is still reverted
to its clean snapshot and powered off (nothing of its last run is kept, on a disk-only claim);
the next run reverts it to the warm snapshot, which resumes the booted guest: no boot. A VM
whose warm snapshot could not be taken (a driver or guest that cannot save memory) still
pools, and boots from the clean snapshot as before.
"""

import logging

from django.db import transaction
from django.utils import timezone

from capacity import services as capacity
from drivers import base
from provisioning import services as vms
from provisioning.opcodes import guest, lifecycle
from provisioning.opcodes.common import load_vm

log = logging.getLogger(__name__)

CANDIDATES = 5  # parked VMs tried (each on its host) before building a new one


def take(run, end, *, actor):
    """A parked VM of the run's image and size, now the run's on a fresh claim on its host, or
    None (no pool, none parked, none where the run fits, or all taken meanwhile). Only VMs no
    reservation used: a reservation's VM would be seeded with that reservation's login."""
    image = run.image
    if not image.pool_size or vms.pool_refusal(image.visibility, image.pool_size):
        return None
    size = {"vcpus": run.vcpus, "memory_mib": run.memory_mib, "disk_gib": run.disk_gib}
    rows = vms.parked(image, size=size).filter(reservations__isnull=True).select_related("host", "allocation")
    for vm in rows[:CANDIDATES]:
        if vms.has_clean_snapshot(vm) and _take_one(vm, run, size, end, actor=actor):
            return vm
    return None


def _take_one(vm, run, size, end, *, actor):
    demand = vms.demand_for(
        image := run.image, size, start=timezone.now(), end=end, purpose=f"vm {vm.pk}", prefer_cached=False
    )
    try:
        with transaction.atomic():
            if vms.is_parked_claim(vm.allocation):  # its disk is counted once: by the run's claim from now
                capacity.release(vm.allocation, actor=actor, reason=f"{vm.key} taken from the {image.name} pool")
            allocation = capacity.claim_on_host(vm.host, demand, actor=actor, owner=run.owner)
            if not vms.take_parked(
                vm,
                actor=actor,
                owner=run.owner,
                allocation=allocation,
                name=f"run-{run.pk}",
                end=end,
                reason=f"run {run.pk}: from the {image.name} pool",
            ):
                raise _Taken
    except (_Taken, capacity.NoCapacity):  # rolled back: its parked claim stands again
        return False
    return True


class _Taken(Exception):
    """Another run took this VM first."""


def warm_up(vm_id, *, actor):
    """Take the warm snapshot of a run's new VM if its image pools and the VM holds no login;
    True when taken. A driver that cannot (or a guest whose memory it cannot save) costs the
    pool its no-boot start, not the run: False, and the run goes on."""
    vm = load_vm(vm_id)
    image = vm.image
    if not image.pool_size or vms.pool_refusal(image.visibility, image.pool_size) or vms.has_warm_snapshot(vm):
        return vms.has_warm_snapshot(vm)
    if vm.reservations.exists() or guest.guest_login(vm) is not None:
        return False  # a login in the guest would be in the snapshot, and so in the next user's VM
    try:
        lifecycle.warm_snapshot(vm_id, actor=actor)
    except base.DriverError as exc:
        log.warning("no warm snapshot of %s (its next runs will boot): %s", vm.key, exc)
        return False
    return True
