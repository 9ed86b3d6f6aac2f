"""Helpers for job tests."""

import time

from jobs import services
from jobs.models import Job


def submit(opcode="noop", params=None, actor="test", **kwargs):
    return services.submit(opcode, params or {}, actor=actor, **kwargs)


def refresh(job):
    return Job.objects.get(pk=job.pk)


def wait_until(predicate, timeout=30, what="the condition", child=None, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if child is not None and not child.alive():
            raise AssertionError(f"{what}: the worker exited:\n{child.output()[-3000:]}")
        time.sleep(interval)
    detail = f"\n{child.output()[-4000:]}" if child is not None else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}{detail}")


def max_overlap(jobs):
    """The most jobs whose [started, ended] intervals overlap at one instant."""
    points = sorted([(j.started, 1) for j in jobs] + [(j.ended, -1) for j in jobs], key=lambda p: (p[0], p[1]))
    best = current = 0
    for _, delta in points:
        current += delta
        best = max(best, current)
    return best
