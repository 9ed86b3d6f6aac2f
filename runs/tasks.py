"""Periodic work of batch runs: suspended runs' resumption, failed runs' kept VMs, and
retention of ended runs' files.

A once-a-minute Schedule (made when a worker starts, django-q2 ``post_spawn``) runs
``housekeeping``, which resumes suspended runs where room has returned
(``services.resume_suspended``; a released claim also triggers it at once), submits
``run.discard`` for each failed run's VM whose keeping time is
over (``services.discard_expired``) and removes the output and files of runs ended more than
``RUNS_RETENTION_DAYS`` ago (``services.expire_files``; the run's row stays and says so).
Several at once are harmless.
"""

import logging

from core import periodic
from core.changelog import Actor

log = logging.getLogger(__name__)
SCHEDULE = "vclmgr: runs housekeeping"
FUNC = "runs.tasks.housekeeping"
MINUTES = 1  # a kept VM's time is in minutes
ACTOR = Actor(name="runs retention")
KEEP_ACTOR = Actor(name="runs kept VMs")


def housekeeping():
    from runs import services

    return {
        "resumed": services.resume_suspended(actor=services.RESUME_ACTOR),
        "discarded": services.discard_expired(actor=KEEP_ACTOR),
        "files_removed": services.expire_files(actor=ACTOR),
    }


def ensure_schedule():
    return periodic.ensure_schedule(SCHEDULE, FUNC, MINUTES)


def on_worker_start(**kwargs):
    """django-q2 ``post_spawn`` receiver."""
    try:
        ensure_schedule()
    except Exception:  # a worker must start even if the database is briefly away
        log.exception("could not ensure the runs housekeeping schedule")
