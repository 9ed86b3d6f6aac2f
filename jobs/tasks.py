"""django-q2 entry points of the job system, and the janitor that keeps it live.

* ``run_next`` — a wake-up token: claim the best startable job, run it, repeat while work is
  eligible and this task's time slice lasts (then enqueue another token).
* ``run_job`` — continue one running job in a fresh task (hand-off; see ``runner``).
* ``sweep`` — recover jobs whose lease expired, complete parents whose children all ended,
  and wake workers if startable jobs have no token. Run by:
    - the janitor: a daemon thread in every django-q2 worker process, started on django-q2's
      ``post_spawn`` signal (so also in workers reincarnated after a crash), sweeping every
      few seconds (a third of the lease, at most 5 s) — this is what bounds recovery time;
    - a django-q2 ``Schedule`` (every minute) created by a data migration and re-created by
      the janitor if missing (e.g. after a database flush): a safety net visible in admin.
  Several sweepers at once are harmless: every change is a conditional UPDATE under the
  queue lock.
"""

import time

from django.db import transaction
from django.utils import timezone

from core import periodic
from jobs import dispatcher, runner, transitions, wake
from jobs.models import Job, QueueSettings

S = Job.Status
SWEEP_SCHEDULE = "vclmgr: job sweep"
SWEEP_FUNC = "jobs.tasks.sweep"


def run_next():
    """Claim and run jobs until none is startable or the time slice is used; returns how many ran."""
    deadline = time.monotonic() + runner.slice_seconds()
    ran = 0
    claim = dispatcher.claim_next()
    while claim is not None:
        if claim.more > 0:  # others could start too: enough tokens for the other workers?
            wake.top_up(min(claim.more, wake.local_workers() - 1), max_age=0.5)
        # The next claim happens in the job's final transaction, if within the time slice.
        _, following = runner.execute_then_claim(claim.id, claim.token, deadline, claim.job, claim.lease_seconds)
        ran += 1
        if following is not None:  # the end looked for the next job (False: none startable)
            claim = following or None
        elif time.monotonic() < deadline:
            claim = dispatcher.claim_next()
        else:
            if dispatcher.pending().exists():
                wake.top_up(1)  # let a fresh task carry on
            break
    return ran


def run_job(job_id, token):
    """Continue a job handed off by an earlier task (no-op if it is no longer ours)."""
    outcome = runner.execute(job_id, token, time.monotonic() + runner.slice_seconds())
    if outcome != "handoff":
        run_next()  # its end may have made others startable
    return outcome


def recover_expired():
    """Jobs whose worker stopped renewing the lease: resume or fail them. Returns how many."""
    now = timezone.now()
    expired = list(Job.objects.filter(status=S.RUNNING, lease_until__lt=now).values_list("pk", flat=True))
    recovered = 0
    for job_id in expired:
        with transaction.atomic():
            queue = QueueSettings.lock()
            if transitions.recover(job_id, queue.max_attempts, now):
                recovered += 1
    return recovered


def complete_stuck_parents():
    """Parents waiting for children that all ended (a safety net; normally done at once)."""
    done = 0
    for parent_id in Job.objects.filter(status=S.WAITING, awaiting_children=True).values_list("pk", flat=True):
        if Job.objects.filter(parent_id=parent_id).exclude(status__in=Job.FINAL).exists():
            continue
        with transaction.atomic():
            QueueSettings.lock()
            parent = transitions.complete_parent(parent_id)
            if parent:
                transitions.settle(parent)
                done += 1
    return done


def sweep():
    recovered = recover_expired()
    parents = complete_stuck_parents()
    woken = 0
    if dispatcher.pending().exists():
        woken = wake.top_up(dispatcher.eligible_count())
    return {"recovered": recovered, "parents": parents, "woken": woken}


# --- the periodic safety net ------------------------------------------------------------
def schedule_exists():
    from django_q.models import Schedule

    return Schedule.objects.filter(name=SWEEP_SCHEDULE).exists()


def ensure_schedule():
    """Create the once-a-minute sweep Schedule if missing (idempotent; duplicates removed)."""
    return periodic.ensure_schedule(SWEEP_SCHEDULE, SWEEP_FUNC, 1)


# --- the janitor thread -----------------------------------------------------------------
def janitor_interval():
    lease = QueueSettings.get().lease_seconds
    return max(0.5, min(5.0, lease / 3))


def start_janitor(**kwargs):
    """django-q2 ``post_spawn`` receiver: one janitor thread per worker process."""
    return periodic.start_daemon("jobs-janitor", sweep, janitor_interval, setup=ensure_schedule)
