"""The hypervisor half of ``cluster.verify``: the database against what each host runs.

Kinds of finding (``VerifyReport.findings``, one dict each, with a ``message`` for people):

- ``unreachable``: the host did not answer ``list_vms``; nothing else is said about its VMs.
- ``unknown``: a VM on a host that vclmgr does not have there; ``ours`` says whether its name
  is one of vclmgr's keys (a leftover) or someone else's VM.
- ``absent``: a VM vclmgr has on a host (built, or in ``error``) that the host does not run.
- ``drift``: both know the VM, but in different states (database running, host stopped ...).
- ``orphan_claim``: an unreleased claim that no live VM, active reservation or parked VM holds.
- ``unclaimed_vm``: a live VM without an unreleased claim.

Only reads; the one repair is ``release_orphan_claim`` (an admin confirms it).
"""

import re
from collections.abc import Callable

from django.db import transaction
from django.db.models import Q

from capacity import services as capacity
from capacity.models import Allocation
from core.errors import Conflict
from core.hooks import Hook
from drivers import base
from drivers import registry as drivers
from inventory.models import Hypervisor
from provisioning.models import VM, VerifyReport

OUR_KEY = re.compile(rf"^{re.escape(base.VM_KEY_PREFIX)}(\d+)$")
# Defined on the host by now; staging/defining may not be yet, migrating is on two hosts at once.
CHECKED = ("starting", "running", "stopped", "suspended", "error")
KEEP_REPORTS = 100
# What else holds a claim, registered at start-up by the layers above this one (reservations:
# its active reservations), so a claim nobody holds is an orphan. ``holds()``: a Q on Allocation
# matching the claims its app holds.
CLAIM_HOLDERS: Hook[Callable[[], Q]] = Hook("provisioning.verify.CLAIM_HOLDERS")


def _finding(kind, message, **fields):
    return {"kind": kind, "message": message, **fields}


def check_host(host):
    """Findings for one host: unreachable, or unknown / absent / drift."""
    try:
        running = {info.key: info for info in drivers.driver_for(host).list_vms()}
    except base.DriverError as exc:
        return [_finding("unreachable", f"{host.name} did not answer: {exc}", host=host.name)]
    known = {vm.key: vm for vm in VM.objects.filter(host=host, state__in=CHECKED)}
    moving = set(VM.objects.filter(state=VM.State.MIGRATING).values_list("pk", flat=True))
    findings = []
    for key, info in sorted(running.items()):
        match = OUR_KEY.match(key)
        if key in known or (match and int(match[1]) in moving):
            continue
        where = f"{key} runs on {host.name} ({info.state})"
        if match:
            message = f"{where} but vclmgr {_why_not_known(int(match[1]), host)}"
        else:
            message = f"{where}; not a vclmgr name (made outside vclmgr?)"
        findings.append(
            _finding("unknown", message, host=host.name, key=key, ours=bool(match), host_state=str(info.state))
        )
    for key, vm in sorted(known.items()):
        info = running.get(key)
        if info is None:
            findings.append(
                _finding(
                    "absent",
                    f"{key} is {vm.state} in vclmgr but absent on {host.name}",
                    host=host.name,
                    key=key,
                    vm=vm.pk,
                    db_state=vm.state,
                )
            )
        elif vm.state in VM.BUILT and str(info.state) != vm.state:
            findings.append(
                _finding(
                    "drift",
                    f"{key} is {vm.state} in vclmgr but {info.state} on {host.name}",
                    host=host.name,
                    key=key,
                    vm=vm.pk,
                    db_state=vm.state,
                    host_state=str(info.state),
                )
            )
    return findings


def _why_not_known(vm_id, host):
    vm = VM.objects.filter(pk=vm_id).select_related("host").first()
    if vm is None:
        return "has no such VM"
    if vm.host_id != host.pk:
        return f"has it on {vm.host or 'no host'} ({vm.state})"
    return f"has it {vm.state}"


def check_claims():
    """Claims nothing holds, and live VMs without a claim."""
    live = VM.objects.filter(state__in=VM.LIVE)
    held = Q(vms__state__in=VM.LIVE) | Q(
        pk__in=live.filter(target_allocation__isnull=False).values("target_allocation")
    )
    for holds in CLAIM_HOLDERS:
        held |= holds()
    orphans = Allocation.objects.filter(released__isnull=True).exclude(held).select_related("host").order_by("pk")
    findings = [
        _finding(
            "orphan_claim",
            f"claim {a.pk} on {a.host.name} ({a.purpose}) is held by no live VM or reservation",
            host=a.host.name,
            allocation=a.pk,
            purpose=a.purpose,
        )
        for a in orphans.distinct()
    ]
    unclaimed = live.filter(Q(allocation__isnull=True) | Q(allocation__released__isnull=False)).select_related("host")
    findings += [
        _finding(
            "unclaimed_vm",
            f"{vm.key} is {vm.state} on {vm.host or 'no host'} without an unreleased claim",
            host=vm.host.name if vm.host else "",
            key=vm.key,
            vm=vm.pk,
            db_state=vm.state,
        )
        for vm in unclaimed.order_by("pk")
    ]
    return findings


def run(*, actor, job_id=None):
    """Check every online or drained host and every claim; store and return the report.

    Offline hosts are left out: an administrator took them out, so silence is expected."""
    hosts = list(
        Hypervisor.objects.filter(state__in=(Hypervisor.State.ONLINE, Hypervisor.State.DRAINED))
        .select_related("credential")
        .order_by("name")
    )
    findings = [f for host in hosts for f in check_host(host)]  # no transaction across driver calls
    findings += check_claims()
    report = VerifyReport.objects.create(job_id=job_id, hosts_checked=len(hosts), findings=findings)
    # an hourly schedule would otherwise keep every report forever; jobs keep their own history
    keep = list(VerifyReport.objects.order_by("-pk").values_list("pk", flat=True)[:KEEP_REPORTS])
    VerifyReport.objects.exclude(pk__in=keep).delete()
    return report


def latest():
    return VerifyReport.objects.order_by("-pk").first()


def release_orphan_claim(allocation_id, reason="", *, actor):
    """Release a claim that nothing holds (checked again now, not trusted from the report)."""
    with transaction.atomic():
        allocation = Allocation.objects.select_for_update().get(pk=allocation_id)
        if allocation.released is not None:
            raise Conflict(f"claim {allocation.pk} is released already")
        if not any(f["allocation"] == allocation.pk for f in check_claims() if f["kind"] == "orphan_claim"):
            raise Conflict(f"claim {allocation.pk} is held (by a live VM or an active reservation)")
        capacity.release(allocation, actor=actor, reason=reason or "orphan claim released after verify")
    return allocation


def job_check(job):
    """``cluster.verify``'s hypervisor check (registered in ``VmsConfig.ready``)."""
    report = run(actor=job.actor, job_id=job.job_id)
    return {"problems": [f["message"] for f in report.findings], "report": report.pk}
