"""Reservations asking for GPUs, on a simulated host whose driver reports one GPU."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from provisioning.opcodes import host_ops
from reservations import services
from reservations.models import Reservation
from tests.conftest import TEST

H = timedelta(hours=1)
A100 = {"gpus": 1, "gpu_model": "nvidia-a100"}


@pytest.fixture
def gpu_host(make_host):
    host = make_host("sim-gpu", cpus=16, memory_mib=32768, disk_gib=200, driver_options={"gpus": {"nvidia-a100": 1}})
    host_ops.refresh_facts(host.pk, actor=TEST)  # the sim driver reports its GPU: placement counts it
    host.refresh_from_db()
    return host


def later(hours):
    return timezone.now().replace(second=0, microsecond=0) + hours * H


def test_overlapping_gpu_reservations_refuse_the_second_with_the_reason_and_earliest_start(gpu_host, image, alice, bob):
    first = services.reserve(alice, image, actor=alice, start=later(2), duration=2 * H, **A100)
    assert first.allocation.host == gpu_host and first.allocation.extras == {"gpu:nvidia-a100": 1}
    with pytest.raises(ValidationError) as caught:
        services.reserve(bob, image, actor=bob, start=later(3), duration=2 * H, **A100)
    message = caught.value.message_dict["start"][0]
    assert "no host has room then (1 lack GPU nvidia-a100" in message
    assert f"needs 1 GPU nvidia-a100 from {later(3):%Y-%m-%d %H:%M} to {later(5):%Y-%m-%d %H:%M}" in message
    assert "at most 0 free (on sim-gpu)" in message
    assert f"the earliest start that fits is {first.end:%Y-%m-%d %H:%M}" in message
    fit = services.check_fit(image, later(3), later(5), **A100)
    assert not fit.fits and fit.earliest == first.end
    assert Reservation.objects.count() == 1


def test_gpu_reservations_that_do_not_overlap_both_succeed(gpu_host, image, alice, bob):
    first = services.reserve(alice, image, actor=alice, start=later(2), duration=2 * H, **A100)
    second = services.reserve(bob, image, actor=bob, start=first.end, duration=2 * H, **A100)
    assert second.allocation.host == gpu_host
    assert (second.gpus, second.gpu_model) == (1, "nvidia-a100")


def test_any_model_is_claimed_as_the_model_the_host_has(gpu_host, image, alice, bob):
    first = services.reserve(alice, image, actor=alice, start=later(2), duration=H, gpus=1)
    assert first.allocation.extras == {"gpu:nvidia-a100": 1} and first.gpu_model == ""
    with pytest.raises(ValidationError, match="tried nvidia-a100"):
        services.reserve(bob, image, actor=bob, start=later(2), duration=H, gpus=1)


def test_a_reservation_without_gpus_is_unchanged(gpu_host, image, alice, bob):
    services.reserve(alice, image, actor=alice, start=later(2), duration=H, **A100)
    plain = services.reserve(bob, image, actor=bob, start=later(2), duration=H)
    assert plain.allocation.host == gpu_host and plain.allocation.extras == {} and plain.gpus == 0


@pytest.mark.parametrize(
    ("ask", "field"),
    [
        ({"gpus": 17}, "gpus"),
        ({"gpus": 0, "gpu_model": "nvidia-a100"}, "gpu_model"),
        ({"gpus": 1, "gpu_model": "a b"}, "gpu_model"),
    ],
)
def test_it_rejects_a_malformed_gpu_ask(gpu_host, image, alice, ask, field):
    with pytest.raises(ValidationError) as caught:
        services.reserve(alice, image, actor=alice, start=later(2), duration=H, **ask)
    assert field in caught.value.message_dict
    assert not Reservation.objects.exists()


def test_the_api_takes_a_gpu_ask_and_shows_it(gpu_host, image, alice, api):
    client = api(alice)
    body = {"image": image.pk, "start": later(2).isoformat(), "duration_minutes": 60, **A100}
    answer = client.post("/api/v1/reservations/", body, format="json")
    assert answer.status_code == 201, answer.content
    shown = answer.json()["reservation"]
    assert (shown["gpus"], shown["gpu_model"]) == (1, "nvidia-a100")
    refused = client.post("/api/v1/reservations/", body, format="json")
    assert refused.status_code == 400 and "lack GPU nvidia-a100" in refused.content.decode()
