"""Helpers of the runs tests: submitting a run as its owner, reading it afresh."""

from runs import services
from runs.models import Run


def submit(user, **kwargs):
    kwargs.setdefault("platform", "debian-12")
    kwargs.setdefault("argv", ["make", "test"])
    kwargs.setdefault("time_limit", 60)
    return services.submit(actor=user, owner=user, **kwargs)


def fresh(run):
    return Run.objects.get(pk=run.pk)
