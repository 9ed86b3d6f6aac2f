"""Periodic work of the VM app: the facts refresh, and the VM clock that ends ad-hoc VMs.

Every ``FACTS_REFRESH_MINUTES`` (setting, default 10; 0 turns it off) the schedule runs
``refresh_all``, which submits one ``hypervisor.refresh`` job per online or drained host that
has none queued or running (offline hosts are left alone: an administrator took them out —
except one the refresh itself took offline, whose return it has to notice).
The jobs carry a ``rate-limit`` reason, so a refresh of thousands of hosts never occupies more
than ``REFRESH_AT_ONCE`` workers, and ``drain_unreachable``: an unreachable host is drained
until it answers again (see ``opcodes.hypervisor_refresh``).

The Schedule is created by a data migration and made to match the setting (created, re-timed
or removed) whenever a worker starts (django-q2 ``post_spawn``).

The VM clock (``end_overdue``) destroys every ad-hoc VM whose end has passed (its claim is
released by the destroy job, once the VM is gone, and counted until then). It runs in a daemon
thread of every worker each ``RESERVATION_TICK_SECONDS`` (the reservations clock's period) and
from a once-a-minute Schedule as a safety net; several at once are harmless (see the service).

Every ``WARM_POOL_SECONDS`` a daemon thread of every worker runs ``fill_warm_pools`` (and a
once-a-minute Schedule as a safety net): each pooled image's warm VMs brought to its minimum and
trimmed to its maximum (``warm.fill``, counted under the image's row lock: several at once are
harmless).

Every hour ``expire_uploads`` removes image uploads abandoned for ``IMAGE_UPLOAD_EXPIRE_HOURS``
with their files (``uploads.expire``); its Schedule is made when a worker starts.
"""

import logging

from django.conf import settings
from django.db.models import Q

from core import periodic
from core.changelog import Actor
from inventory.models import Hypervisor
from jobs import services as jobs
from jobs.models import Job

log = logging.getLogger(__name__)
REFRESH_SCHEDULE = "vclmgr: facts refresh"
REFRESH_FUNC = "provisioning.tasks.refresh_all"
REFRESH_AT_ONCE = 8
REFRESH_REASON = f"rate-limit:{REFRESH_AT_ONCE}:facts refresh"
ACTOR = Actor(name="facts refresh")
END_SCHEDULE = "vclmgr: VM ends"
END_FUNC = "provisioning.tasks.end_overdue"
VERIFY_SCHEDULE = "vclmgr: cluster verify"
VERIFY_FUNC = "provisioning.tasks.submit_verify"
VERIFY_ACTOR = Actor(name="scheduled verify")
UPLOADS_SCHEDULE = "vclmgr: image uploads expiry"
UPLOADS_FUNC = "provisioning.tasks.expire_uploads"
UPLOADS_MINUTES = 60
WARM_SCHEDULE = "vclmgr: warm pools"
WARM_FUNC = "provisioning.tasks.fill_warm_pools"


def refresh_all():
    """Submit ``hypervisor.refresh`` for every online or drained host not being refreshed already
    (and an offline one this refresh took offline, so that its return is noticed)."""
    from provisioning.opcodes.host_ops import AUTO_OFFLINE

    in_service = Q(state__in=(Hypervisor.State.ONLINE, Hypervisor.State.DRAINED))
    hosts = list(
        Hypervisor.objects.filter(in_service | Q(state=Hypervisor.State.OFFLINE, state_reason__startswith=AUTO_OFFLINE))
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    busy = {
        params.get("hypervisor")
        for params in Job.objects.filter(
            opcode="hypervisor.refresh", status__in=(*Job.PENDING, Job.Status.RUNNING)
        ).values_list("params", flat=True)
    }
    todo = [pk for pk in hosts if pk not in busy]
    for start in range(0, len(todo), jobs.MAX_BATCH):
        specs = [
            {
                "opcode": "hypervisor.refresh",
                "params": {"hypervisor": pk, "drain_unreachable": True},
                "reason": [REFRESH_REASON],
            }
            for pk in todo[start : start + jobs.MAX_BATCH]
        ]
        jobs.submit_batch(specs, actor=ACTOR, source="vclmgr:schedule")
    return {"submitted": len(todo), "skipped": len(hosts) - len(todo)}


def ensure_schedule(minutes=None):
    """Make the refresh Schedule match ``FACTS_REFRESH_MINUTES`` (idempotent)."""
    minutes = settings.FACTS_REFRESH_MINUTES if minutes is None else minutes
    return periodic.ensure_schedule(REFRESH_SCHEDULE, REFRESH_FUNC, minutes)


def on_worker_start(**kwargs):
    """django-q2 ``post_spawn`` receiver."""
    try:
        ensure_schedule()
        ensure_verify_schedule()
        periodic.ensure_schedule(UPLOADS_SCHEDULE, UPLOADS_FUNC, UPLOADS_MINUTES)
        periodic.ensure_schedule(WARM_SCHEDULE, WARM_FUNC, 1)
    except Exception:  # a worker must start even if the database is briefly away; the migration made it
        log.exception("could not ensure the facts refresh, verify, uploads expiry or warm pools schedule")
    periodic.start_daemon(
        "warm-pools",
        fill_warm_pools,
        lambda: settings.WARM_POOL_SECONDS,
        wait_first=True,
    )
    periodic.start_daemon(
        "vm-clock",
        end_overdue,
        lambda: settings.RESERVATION_TICK_SECONDS,
        setup=lambda: periodic.ensure_schedule(END_SCHEDULE, END_FUNC, 1),
        wait_first=True,
    )


def end_overdue():
    """The VM clock's round: destroy the ad-hoc VMs whose time is over."""
    from provisioning import services

    return services.end_overdue(actor=Actor(name="VM clock"))


def fill_warm_pools():
    """The warm pools' round: each pooled image topped up to its minimum, trimmed to its maximum."""
    from provisioning import warm

    return warm.fill_round()


def expire_uploads():
    """Remove abandoned image uploads and the disks of deleted uploaded images (``uploads.expire``)."""
    from provisioning import uploads

    return uploads.expire()


def submit_prestage(image_id, group_id):
    """A scheduled pre-stage's time has come: submit its job."""
    from inventory.models import NodeGroup
    from provisioning import services
    from provisioning.models import Image

    image, group = Image.objects.get(pk=image_id), NodeGroup.objects.get(pk=group_id)
    return services.prestage(image, group, actor=Actor(name="scheduled pre-stage")).pk


def ensure_verify_schedule(minutes=None):
    """Make the verify Schedule match ``VERIFY_MINUTES`` (idempotent; 0 removes it)."""
    minutes = settings.VERIFY_MINUTES if minutes is None else minutes
    return periodic.ensure_schedule(VERIFY_SCHEDULE, VERIFY_FUNC, minutes)


def submit_verify():
    """Submit ``cluster.verify`` unless one is queued or running (a slow host must not pile them up)."""
    if Job.objects.filter(opcode="cluster.verify", status__in=(*Job.PENDING, Job.Status.RUNNING)).exists():
        return None
    return jobs.submit("cluster.verify", {}, actor=VERIFY_ACTOR, source="vclmgr:schedule").pk
