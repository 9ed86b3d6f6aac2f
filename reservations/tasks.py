"""The reservations clock: starts what is due, ends what is over, warns what ends soon.

Run by a daemon thread in every django-q2 worker process (started on ``post_spawn``) every
``RESERVATION_TICK_SECONDS``, and by a once-a-minute django-q2 ``Schedule`` as a safety net
visible in admin. Several clocks at once are harmless: every change is a conditional UPDATE.
"""

from django.conf import settings

from vclmgr import periodic

TICK_SCHEDULE = "vclmgr: reservations clock"
TICK_FUNC = "reservations.tasks.tick"


def tick():
    from reservations import services

    return services.tick()


def ensure_schedule():
    return periodic.ensure_schedule(TICK_SCHEDULE, TICK_FUNC, 1)


def start_clock(**kwargs):
    """django-q2 ``post_spawn`` receiver: one clock thread per worker process."""
    return periodic.start_daemon(
        "reservations-clock", tick, lambda: settings.RESERVATION_TICK_SECONDS, setup=ensure_schedule, wait_first=True
    )
