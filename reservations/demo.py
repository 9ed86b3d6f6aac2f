"""Demo reservations data: a students group with a quota rule and a weekly class block.

Idempotent: the group, rule and block are made once (by name).
"""

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.utils import timezone

from provisioning.vms.models import Image, QuotaRule
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
                actor="demo", name=BLOCK, image=image, group=students, seats=4, start=monday,
                end=monday + timedelta(hours=2), weeks=4,
            )  # fmt: skip
            made = "made"
        except ValidationError as exc:  # a demo inventory too small for it: say so, carry on
            made = f"skipped ({'; '.join(exc.messages)})"
    stdout.write(f"  reservations: group 'students' (demo is a member), quota rule, class block {made}")
