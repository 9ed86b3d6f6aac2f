"""Demo jobs: a few finished and queued jobs so the jobs page has something to show.

Idempotent: does nothing once any job exists. Runs without workers: queued jobs start
when ``serve`` (or a ``qcluster``) runs.
"""

from django.contrib.auth import get_user_model

from jobs import services
from jobs.models import Job, QueueSettings


def jobs(stdout):
    QueueSettings.get()
    if Job.objects.exists():
        stdout.write("  jobs: already there")
        return
    User = get_user_model()
    admin = User.objects.filter(is_staff=True).order_by("pk").first()
    user = User.objects.filter(is_staff=False).order_by("pk").first()
    verify = services.submit("cluster.verify", {}, actor=admin or "demo", reason="demo: check the bookkeeping")
    services.submit(
        "test.expand",
        {"children": [{"opcode": "test.sleep", "params": {"steps": 3, "seconds": 2}}] * 3},
        actor=admin or "demo",
        reason="rate-limit:2:demo maintenance",
        depends=[[verify.pk, []]],
    )
    services.submit("test.sleep", {"steps": 5, "seconds": 1}, actor=user or "demo", reason="demo: a user's job")
    stdout.write("  jobs: 3 demo jobs queued (they run when the workers do)")
