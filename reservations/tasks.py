"""The reservations clock: starts what is due, ends what is over, warns what ends soon.

Run by a daemon thread in every django-q2 worker process (started on ``post_spawn``) every
``RESERVATION_TICK_SECONDS``, and by a once-a-minute django-q2 ``Schedule`` as a safety net
visible in admin. Several clocks at once are harmless: every change is a conditional UPDATE.
"""

import logging
import random
import threading
import time

from django.conf import settings
from django.db import close_old_connections, connection

log = logging.getLogger(__name__)
TICK_SCHEDULE = "vclmgr: reservations clock"
TICK_FUNC = "reservations.tasks.tick"


def tick():
    from reservations import services

    return services.tick()


def ensure_schedule():
    from django_q.models import Schedule

    rows = list(Schedule.objects.filter(name=TICK_SCHEDULE).order_by("pk"))
    if not rows:
        Schedule.objects.create(
            name=TICK_SCHEDULE, func=TICK_FUNC, schedule_type=Schedule.MINUTES, minutes=1, repeats=-1
        )
    for extra in rows[1:]:
        extra.delete()


_clock = None


def _loop():
    try:
        ensure_schedule()
    except Exception:
        log.exception("could not ensure the reservations clock schedule")
    while True:
        time.sleep(settings.RESERVATION_TICK_SECONDS * random.uniform(0.8, 1.2))  # noqa: S311 (jitter)
        try:
            close_old_connections()
            tick()
        except Exception:  # keep ticking; a database hiccup must not stop reservations ending
            log.exception("reservations tick failed")
            connection.close()


def start_clock(**kwargs):
    """django-q2 ``post_spawn`` receiver: one clock thread per worker process."""
    global _clock
    if _clock is not None and _clock.is_alive():
        return
    _clock = threading.Thread(target=_loop, name="reservations-clock", daemon=True)
    _clock.start()
