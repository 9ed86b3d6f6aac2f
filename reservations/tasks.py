"""The reservations clock: starts what is due, ends what is over, warns what ends soon.

Run by a daemon thread in every django-q2 worker process (started on ``post_spawn``) every
``RESERVATION_TICK_SECONDS``, and by a once-a-minute django-q2 ``Schedule`` as a safety net
visible in admin. Several clocks at once are harmless: every change is a conditional UPDATE.
The idle round (``idle_round``) runs likewise every ``IDLE_CHECK_SECONDS`` in its own thread.
"""

from django.conf import settings

from core import periodic

TICK_SCHEDULE = "vclmgr: reservations clock"
TICK_FUNC = "reservations.tasks.tick"
# Usage: yesterday and the day before are stored hourly (re-done: late ends are picked up).
USAGE_SCHEDULE = "vclmgr: usage aggregation"
USAGE_FUNC = "reservations.tasks.aggregate_usage"
USAGE_MINUTES = 60
# Idle reclamation: a round submits one reservation.idle_check job when a guest is due.
IDLE_SCHEDULE = "vclmgr: idle reclamation"
IDLE_FUNC = "reservations.tasks.idle_round"
IDLE_ACTOR_NAME = "idle reclamation"
# Pre-staging: class sessions coming into the look-ahead get their image copied ahead.
PRESTAGE_SCHEDULE = "vclmgr: pre-stage for classes"
PRESTAGE_FUNC = "reservations.tasks.prestage_round"
PRESTAGE_MINUTES = 15


def tick():
    from reservations import services

    return services.tick()


def aggregate_usage():
    from reservations import rollup

    return [day.isoformat() for day in rollup.aggregate_missing()]


def idle_round(now=None):
    """Submit ``reservation.idle_check`` if a ready reservation's guest is due to be asked and no
    such job is queued or running (one indexed query when nothing is due). Returns its id."""
    from core.changelog import Actor
    from jobs import services as jobs
    from jobs.models import Job
    from reservations import idle

    if not idle.due(now, limit=1):
        return None
    if Job.objects.filter(opcode="reservation.idle_check", status__in=(*Job.PENDING, Job.Status.RUNNING)).exists():
        return None
    job = jobs.submit("reservation.idle_check", {}, actor=Actor(name=IDLE_ACTOR_NAME), source="vclmgr:schedule")
    return job.pk


def prestage_round(now=None):
    """Submit the ``image.stage`` jobs upcoming block seats need (``reservations.prestage``);
    returns their ids."""
    from reservations import prestage

    return [job.pk for job in prestage.prestage(now)]


def ensure_schedule():
    periodic.ensure_schedule(PRESTAGE_SCHEDULE, PRESTAGE_FUNC, PRESTAGE_MINUTES)
    periodic.ensure_schedule(USAGE_SCHEDULE, USAGE_FUNC, USAGE_MINUTES)
    periodic.ensure_schedule(IDLE_SCHEDULE, IDLE_FUNC, 1)
    return periodic.ensure_schedule(TICK_SCHEDULE, TICK_FUNC, 1)


def start_clock(**kwargs):
    """django-q2 ``post_spawn`` receiver: one clock thread per worker process."""
    periodic.start_daemon("reservations-idle", idle_round, lambda: settings.IDLE_CHECK_SECONDS, wait_first=True)
    return periodic.start_daemon(
        "reservations-clock", tick, lambda: settings.RESERVATION_TICK_SECONDS, setup=ensure_schedule, wait_first=True
    )
