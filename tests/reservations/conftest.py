"""Fixtures for reservations: simulated hosts, an image, jobs run in this process."""

import pytest
from django.contrib.auth.models import Group

from provisioning import services as vms
from tests.images import image_maintainer, sim_image
from tests.jobs.conftest import sync_jobs  # noqa: F401 (fixture)
from tests.mailserver import mail, smtp_module  # noqa: F401 (fixtures: one SMTP server per module)


@pytest.fixture
def image(db):
    return sim_image(
        "debian-12", os="Debian 12", min_memory_mib=256, default_vcpus=2, default_memory_mib=2048, default_disk_gib=10
    )


@pytest.fixture
def lab(image):
    group = Group.objects.create(name="lab")
    vms.update_image(image, actor="test", visibility="restricted", groups=[group])
    return group


@pytest.fixture
def maya(lab):
    """An image maintainer of ``lab`` (the image's group)."""
    return image_maintainer(lab)


@pytest.fixture
def student(bob, lab):
    bob.groups.add(lab)
    return bob
