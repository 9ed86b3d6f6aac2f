"""Warm VMs ahead of a class session: its seats take them instead of booting.

``provisioning.warm.AHEAD``: from ``CLASS_WARM_MINUTES`` before a session's seats are built
(its class's ``lead_minutes`` before its start, or the reservations clock's
``RESERVATION_LEAD_MINUTES`` if that is earlier) until they are, each seat still pending wants a
warm VM of the image on its claim's host, whose yielding claim ends at the session's start
(when the seat's own begins: the two never hold the same room at once, and any reservation that
needs that room before then takes it); where that host has no room for it, on another host with
room for it and then for the seat until the session's end (the seat's claim moves there when it
takes it, or stays if that room is gone by then). The warm pools' round makes them; the seat's build
(``classes.services.build_due``, through ``reserving.provision``) takes one as any reservation
takes a warm VM, or builds cold when none is there. Seats of the image's default size only,
without GPUs, of a class of an image (an environment's machines are built cold).
"""

from collections import Counter
from datetime import timedelta

from django.conf import settings
from django.db.models import Max

from classes.models import Meeting
from provisioning import services as vms
from provisioning.warm import Ahead
from reservations.models import Reservation


def ahead(now):
    """The ``Ahead`` rows of the sessions whose warm time has come and whose seats are not built."""
    if not settings.CLASS_WARM_MINUTES:
        return []
    warm = timedelta(minutes=settings.CLASS_WARM_MINUTES)
    # Built by the planner its class's lead before, or by the reservations clock its lead before: the earlier.
    clock = settings.RESERVATION_LEAD_MINUTES
    longest = Meeting.objects.aggregate(lead=Max("klass__lead_minutes"))["lead"] or 0
    horizon = now + warm + timedelta(minutes=max(longest, clock))  # no session whose warm time has come is missed
    meetings = Meeting.objects.filter(block__canceled=False, start__gt=now, start__lte=horizon)
    meetings = meetings.filter(klass__environment__isnull=True, klass__gpus=0, klass__image__active=True)
    meetings = list(meetings.filter(klass__image__revert_on_end=False).select_related("klass__image"))
    lead = {m.pk: timedelta(minutes=max(m.klass.lead_minutes, clock)) for m in meetings}
    due = {m.block_id: m for m in meetings if m.start - lead[m.pk] - warm <= now}
    if not due:
        return []
    seats = Reservation.objects.filter(block_id__in=due, status=Reservation.Status.PENDING, gpus=0)
    rows = seats.values_list("block_id", "allocation__host_id", "allocation__end", "vcpus", "memory_mib", "disk_gib")
    wanted, ends = Counter(), {}
    for block_id, host_id, end, *size in rows:
        meeting = due[block_id]
        image = meeting.klass.image
        if host_id is not None and tuple(size) == tuple(vms.size_for(image).values()):
            key = image.pk, host_id, meeting.start
            wanted[key] += 1
            ends[key] = max((e for e in (end, ends.get(key)) if e is not None), default=None)
    return [Ahead(*key, count, ends[key]) for key, count in wanted.items()]
