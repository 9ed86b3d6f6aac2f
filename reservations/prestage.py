"""Pre-staging for classes: an image's production revision copied, ahead of time, onto the hosts
where its block seats (class sessions) starting within ``VCLMGR_PRESTAGE_LOOKAHEAD_HOURS`` hold
their claims, so a session's VMs do not all wait for the copy when it starts.

It only submits ``image.stage`` jobs (provisioning's throttled staging, which picks the host's
variant of the production revision when it runs): the transfer limits hold as for any other
copy. Idempotent: a host that has the variant staged or being staged, or an ``image.stage`` of
the image queued or running for it, gets nothing; a host that is not online is skipped.

Run when a revision becomes production (``on_image_updated``, an ``image.updated`` listener:
provisioning knows nothing of blocks) and by a periodic pass (``reservations.tasks``) that picks
up seats coming into the window and copies that failed.
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.changelog import Actor
from inventory.models import Hypervisor
from jobs import services as jobs
from jobs.models import Job
from provisioning import services as vms
from provisioning.models import HostImage, ImageVariant
from reservations.models import Reservation

log = logging.getLogger(__name__)
ACTOR_NAME = "pre-staging"
BUSY = (*Job.PENDING, Job.Status.RUNNING)


def upcoming(now=None, image_id=None):
    """``{image id: {host id, …}}``: where the seats of live blocks starting within the look-ahead
    hold their claims."""
    now = now or timezone.now()
    seats = Reservation.objects.filter(
        block__isnull=False,
        block__canceled=False,
        status__in=Reservation.ACTIVE,
        start__gt=now,
        start__lte=now + timedelta(hours=settings.VCLMGR_PRESTAGE_LOOKAHEAD_HOURS),
        allocation__isnull=False,
        allocation__released__isnull=True,
    )
    if image_id is not None:
        seats = seats.filter(image_id=image_id)
    found = {}
    for image, host in seats.values_list("image_id", "allocation__host_id").distinct():
        found.setdefault(image, set()).add(host)
    return found


def prestage(now=None, image_id=None):
    """Submit the ``image.stage`` jobs the upcoming block seats need (of one image, or of all);
    returns the jobs."""
    submitted = []
    for image, hosts in upcoming(now, image_id).items():
        submitted += [_stage(image, host) for host in _lacking(image, hosts)]
    return submitted


def _lacking(image_id, host_ids):
    """The online hosts of ``host_ids`` that have no copy of the image's production variant for
    their type, staged or on its way."""
    variants = {v.hypervisor_type: v for v in ImageVariant.objects.filter(image_id=image_id).production()}
    hosts = Hypervisor.objects.filter(pk__in=host_ids, state=Hypervisor.State.ONLINE).order_by("pk")
    copies = HostImage.objects.filter(
        host_id__in=host_ids, variant__in=variants.values(), state__in=(HostImage.State.STAGED, HostImage.State.STAGING)
    )
    held = set(copies.values_list("host_id", "variant_id"))
    queued = Job.objects.filter(opcode="image.stage", status__in=BUSY, params__image=image_id)
    queued = set(queued.values_list("params__hypervisor", flat=True))
    for host in hosts:
        variant = vms.pick_variant(variants, host.hypervisor_type)
        if variant is not None and (host.pk, variant.pk) not in held and host.pk not in queued:
            yield host.pk


def _stage(image_id, host_id):
    return jobs.submit(
        "image.stage",
        {"image": image_id, "hypervisor": host_id},
        actor=Actor(name=ACTOR_NAME),
        source="vclmgr:schedule",
        reason="pre-stage for the class sessions starting on this host",
    )


def on_image_updated(kind, data, topics, ids):
    """``image.updated`` listener: a revision made production is pre-staged once the change is
    committed (a failure then is logged; the periodic pass tries again)."""
    if data.get("state") == "production" and "revision" in data:
        image_id = data["id"]
        transaction.on_commit(lambda: _after_commit(image_id), robust=True)


def _after_commit(image_id):
    made = prestage(image_id=image_id)
    if made:
        log.info("image %s: %d pre-staging jobs for upcoming class sessions", image_id, len(made))
