"""A user's runs on their home page, each with the next thing to do. Read-only.

``runs_of(user, now)``: their own runs that are active, or ended within ``ENDED_SHOWN``
(never anyone else's), newest first, each with ``next_action``: ``watch`` (queued or
running: the live log), ``output`` (succeeded), ``why`` (failed or canceled: the reason).
"""

from datetime import timedelta

from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from core.next_action import Action
from runs.models import ACTIVE, Run

S = Run.State
ENDED_SHOWN = timedelta(hours=24)
SHOWN = 20


def next_action(run):
    detail = reverse("runs:detail", args=[run.pk])
    if run.state in ACTIVE:
        return Action("watch", "Watch its log", detail)
    if run.state == S.SUCCESS:
        return Action("output", "See its output", detail)
    first_line = (run.error or "see its log").splitlines()[0][:200]
    return Action("why", f"See why: {first_line}", detail)


def runs_of(user, now=None):
    now = now or timezone.now()
    shown = Q(state__in=ACTIVE) | Q(ended__gte=now - ENDED_SHOWN)
    rows = Run.objects.filter(shown, owner=user).select_related("image").order_by("-pk")[:SHOWN]
    return [(run, next_action(run)) for run in rows]
