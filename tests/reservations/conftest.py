"""Fixtures for reservations: simulated hosts, an image, jobs run in this process."""

import pytest
from django.contrib.auth.models import Group

from accounts import access
from provisioning import services as vms
from tests.jobs.conftest import SyncJobs


@pytest.fixture
def sync_jobs(monkeypatch):
    return SyncJobs(monkeypatch)


@pytest.fixture
def sim_host(make_host):
    return make_host("sim-1", driver="sim", cpus=8, memory_mib=8192, disk_gib=200)


@pytest.fixture
def image(db):
    image = vms.create_image(
        actor="test",
        name="debian-12",
        os="Debian 12",
        min_memory_mib=256,
        default_vcpus=2,
        default_memory_mib=2048,
        default_disk_gib=10,
    )
    vms.add_variant(
        image,
        actor="test",
        hypervisor_type="sim",
        format="sim",
        location="sim://library/debian-12",
        checksum="",
        size_gib=2,
    )
    return image


@pytest.fixture
def lab(image):
    group = Group.objects.create(name="lab")
    vms.update_image(image, actor="test", visibility="restricted", groups=[group])
    return group


@pytest.fixture
def maya(django_user_model, lab):
    """An image maintainer of ``lab`` (the image's group)."""
    user = django_user_model.objects.create_user("maya")
    access.set_roles(user, ["image-maintainer"], actor="test")
    user.groups.add(lab)
    return user


@pytest.fixture
def student(bob, lab):
    bob.groups.add(lab)
    return bob
