"""An image's host tags and anti-affinity group bind every real claim a reservation makes,
not only the dry-run plan."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from provisioning import services as vms
from reservations import services

H = timedelta(hours=1)


@pytest.fixture
def hosts(make_host):
    made = {name: make_host(name, cpus=8, memory_mib=8192, disk_gib=200) for name in ("plain-1", "gpu-1", "gpu-2")}
    made["gpu-1"].tags.add("gpu")
    made["gpu-2"].tags.add("gpu", "old")
    return made


def test_a_gpu_image_is_reserved_on_a_gpu_host_only(hosts, image, alice, bob, sync_jobs):
    vms.update_image(image, actor="test", required_tags=["gpu"], forbidden_tags=["old"])
    reservation = services.reserve(alice, image, actor=alice, duration=2 * H)
    assert reservation.allocation.host == hosts["gpu-1"]
    sync_jobs.drain()
    reservation.refresh_from_db()
    assert reservation.status == "ready" and reservation.vm.host == hosts["gpu-1"]
    # gpu-1 has room for four (2048 of its 8192 MiB each); the plain host and the "old" GPU
    # host never take one, whatever room they have.
    for user in (bob, bob, alice):
        assert services.reserve(user, image, actor=user, duration=2 * H).allocation.host == hosts["gpu-1"]
    with pytest.raises(ValidationError) as refused:
        services.reserve(alice, image, actor=alice, duration=2 * H)
    text = str(refused.value)
    assert "1 missing a required tag" in text and "1 carry a forbidden tag" in text and "1 lack memory" in text


def test_a_refusal_names_the_tag_no_host_has(hosts, image, alice):
    vms.update_image(image, actor="test", required_tags=["tpu"])
    with pytest.raises(ValidationError, match="no host has tag tpu"):
        services.reserve(alice, image, actor=alice, duration=2 * H)
    fit = services.check_fit(image, timezone.now(), timezone.now() + H)
    assert not fit.fits and "no host has tag tpu" in fit.message


def test_an_anti_affinity_group_spreads_reservations_over_hosts(hosts, image, alice, bob):
    vms.update_image(image, actor="test", anti_affinity="exam-proctors")
    placed = {
        services.reserve(user, image, actor=user, duration=2 * H).allocation.host_id for user in (alice, bob, alice)
    }
    assert placed == {host.pk for host in hosts.values()}
    with pytest.raises(ValidationError, match="anti-affinity"):
        services.reserve(bob, image, actor=bob, duration=2 * H)
    # Not overlapping in time, they may share a host again.
    later = timezone.now() + 3 * H
    assert services.reserve(bob, image, actor=bob, start=later, duration=H).allocation.host_id in placed
