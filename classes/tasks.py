"""The classes' planner: claims the sessions coming into the look-ahead and builds those whose
lead time has come (``services.plan_round``).

Run by a daemon thread in every django-q2 worker process (started on ``post_spawn``) every
``CLASS_PLAN_SECONDS``, and by a once-a-minute django-q2 ``Schedule`` as a safety net visible in
admin. Several at once are harmless: a class's row is locked while its sessions are claimed,
and a session is made once per class and start.
"""

from django.conf import settings

from core import periodic

PLAN_SCHEDULE = "vclmgr: classes planner"
PLAN_FUNC = "classes.tasks.plan_round"


def plan_round(now=None):
    from classes import services

    return services.plan_round(now)


def ensure_schedule():
    return periodic.ensure_schedule(PLAN_SCHEDULE, PLAN_FUNC, 1)


def start_planner(**kwargs):
    """django-q2 ``post_spawn`` receiver: one planner thread per worker process."""
    return periodic.start_daemon(
        "classes-planner", plan_round, lambda: settings.CLASS_PLAN_SECONDS, setup=ensure_schedule, wait_first=True
    )
