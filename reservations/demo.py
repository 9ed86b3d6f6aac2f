"""Demo reservations data: a students group with a quota rule and a weekly class block.

Idempotent: the group, rule and block are made once (by name).
"""

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.utils import timezone

from provisioning.models import Image, QuotaRule
from reservations import services
from reservations.models import BlockAllocation

BLOCK = "Intro to Linux (lab)"


def reservations(stdout):
    students, _ = Group.objects.get_or_create(name="students")
    demo = get_user_model().objects.filter(username="demo").first()
    if demo is not None:
        demo.groups.add(students)
    QuotaRule.objects.get_or_create(
        name="students", defaults={"group": students, "max_duration_minutes": 4 * 60, "max_per_user": 2}
    )
    image = Image.objects.filter(name="debian-12").first()
    made = "already there"
    if image is not None and not BlockAllocation.objects.filter(name=BLOCK).exists():
        today = timezone.now().replace(hour=10, minute=0, second=0, microsecond=0)
        monday = today + timedelta(days=(7 - today.weekday()) % 7 or 7)
        try:
            services.create_block(
                actor="demo",
                name=BLOCK,
                image=image,
                group=students,
                seats=4,
                start=monday,
                end=monday + timedelta(hours=2),
                weeks=4,
            )
            made = "made"
        except ValidationError as exc:  # a demo inventory too small for it: say so, carry on
            made = f"skipped ({'; '.join(exc.messages)})"
    stdout.write(f"  reservations: group 'students' (demo is a member), quota rule, class block {made}")


# --- synthetic usage history (the usage page's screenshot, bench/usage.py) -------------------


def _raw_times():
    """Let bulk inserts keep the given ``created`` / ``at`` (history made after the fact)."""
    from contextlib import contextmanager

    from reservations.models import Reservation, ReservationHistory

    fields = [Reservation._meta.get_field("created"), ReservationHistory._meta.get_field("at")]

    @contextmanager
    def raw():
        for f in fields:
            f.auto_now_add = False
        try:
            yield
        finally:
            for f in fields:
                f.auto_now_add = True

    return raw()


def usage_history(days, per_day, *, seed=1, now=None, batch=5000):
    """``per_day`` ended reservations a day over the last ``days`` days (daytime-weighted, 1-4 h,
    ready after 20-300 s, 1 in 20 failed), some refusals, spread over the demo's images and
    users in a few groups. Returns the number of reservations made. Not idempotent."""
    import random

    from reservations.models import Refusal, Reservation

    rng = random.Random(seed)
    now = now or timezone.now()
    images = list(Image.objects.order_by("pk")[:6])
    users = []
    for i, group_name in enumerate(("physics", "chemistry", "cs-101", "staff-lab")):
        group, _ = Group.objects.get_or_create(name=group_name)
        for j in range(5):
            user, _ = get_user_model().objects.get_or_create(username=f"student{i}{j}")
            user.groups.add(group)
            users.append(user)
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    made = 0
    rows, pending = [], []
    with _raw_times():
        for day in range(days, 0, -1):
            base = today - timedelta(days=day)
            for _ in range(per_day):
                start = base + timedelta(minutes=rng.choice((rng.randint(8 * 60, 18 * 60), rng.randint(0, 1439))))
                end = start + timedelta(minutes=rng.randint(60, 240))
                failed = rng.random() < 0.05
                rows.append(
                    Reservation(
                        user=rng.choice(users),
                        image=rng.choice(images),
                        start=start,
                        end=end,
                        created=start,
                        status="failed" if failed else "ended",
                        vcpus=2,
                        memory_mib=2048,
                        disk_gib=10,
                    )
                )
                pending.append((start, end, failed, rng.randint(20, 300)))
            refused = rng.randint(0, per_day // 20 + 1)
            Refusal.objects.bulk_create(
                Refusal(
                    at=base + timedelta(hours=rng.randint(8, 18)),
                    user=rng.choice(users),
                    image=rng.choice(images).name,
                    reason=rng.choice(("lacks_memory_mib", "lacks_vcpus", "drained", "max_vms")),
                )
                for _ in range(refused)
            )
            if len(rows) >= batch or day == 1:
                made += _flush(rows, pending)
                rows, pending = [], []
    return made


def _flush(rows, pending):
    from reservations.models import Reservation, ReservationHistory

    created = Reservation.objects.bulk_create(rows)
    history = []
    for r, (start, end, failed, wait) in zip(created, pending, strict=True):
        history.append(ReservationHistory(reservation=r, status="pending", reason="reserved", at=start))
        if failed:
            history.append(
                ReservationHistory(
                    reservation=r, status="failed", reason="failed: demo", at=start + timedelta(seconds=wait)
                )
            )
        else:
            ready = start + timedelta(seconds=wait)
            history.append(ReservationHistory(reservation=r, status="ready", reason="ready", at=ready))
            history.append(ReservationHistory(reservation=r, status="ended", reason="ended", at=end))
    ReservationHistory.objects.bulk_create(history, batch_size=5000)
    return len(created)
