"""Fixtures for classes: a course with an instructor and a student, another course's instructor
(``rival``), an image, a simulated host (``sim_host``), jobs run in this process (``sync_jobs``)."""

from datetime import time, timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from accounts import access
from classes.calendar import Session
from tests.images import sim_image
from tests.jobs.conftest import sync_jobs  # noqa: F401 (fixture)
from tests.mailserver import mail, smtp_module  # noqa: F401 (fixtures: one SMTP server per module)


@pytest.fixture
def image(db):
    return sim_image(
        "debian-12", os="Debian 12", min_memory_mib=256, default_vcpus=2, default_memory_mib=2048, default_disk_gib=10
    )


@pytest.fixture
def course(db):
    return Group.objects.create(name="cs101")


@pytest.fixture
def instructor(alice, course):
    """alice: an instructor in cs101."""
    course.user_set.add(alice)
    access.set_roles(alice, ["instructor"], actor=alice)
    return alice


@pytest.fixture
def student(bob, course):
    course.user_set.add(bob)
    return bob


@pytest.fixture
def rival(django_user_model):
    """carol: an instructor of another course."""
    carol = django_user_model.objects.create_user("carol")
    Group.objects.create(name="ee201").user_set.add(carol)
    access.set_roles(carol, ["instructor"], actor=carol)
    return carol


@pytest.fixture
def term():
    """A term of two weeks from the day after tomorrow, meeting that weekday at 10:00 UTC for an hour."""
    first = (timezone.now() + timedelta(days=2)).date()
    return {
        "first_day": first,
        "last_day": first + timedelta(days=13),
        "sessions": [Session(first.weekday(), time(10, 0), 60)],
        "time_zone": "UTC",
    }
