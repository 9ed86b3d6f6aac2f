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


# --- an image's default GPUs; the reserve page and the CLI --------------------------------------


@pytest.fixture
def cuda(image):
    from provisioning import services as vms

    return vms.update_image(image, actor=TEST, default_gpus=1, default_gpu_model="nvidia-a100")


def test_a_reservation_that_says_nothing_asks_for_its_images_default_gpus(gpu_host, cuda, alice, bob):
    first = services.reserve(alice, cuda, actor=alice, start=later(2), duration=H)

    assert (first.gpus, first.gpu_model) == (1, "nvidia-a100")
    assert first.allocation.extras == {"gpu:nvidia-a100": 1}
    plain = services.reserve(bob, cuda, actor=bob, start=later(2), duration=H, gpus=0)  # no GPU, said so
    assert (plain.gpus, plain.gpu_model, plain.allocation.extras) == (0, "", {})
    assert not services.check_fit(cuda, later(2), later(3)).fits  # the default's one GPU is taken then


def test_the_api_applies_the_images_default_when_the_ask_is_absent(gpu_host, cuda, alice, api):
    body = {"image": cuda.pk, "start": later(2).isoformat(), "duration_minutes": 60}

    answer = api(alice).post("/api/v1/reservations/", body, format="json")

    assert answer.status_code == 201, answer.content
    assert (answer.json()["reservation"]["gpus"], answer.json()["reservation"]["gpu_model"]) == (1, "nvidia-a100")


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"default_gpus": 17}, "default_gpus"),
        ({"default_gpu_model": "nvidia-a100"}, "default_gpu_model"),  # a model needs GPUs
        ({"default_gpus": 1, "default_gpu_model": "a b"}, "default_gpu_model"),
    ],
)
def test_it_rejects_an_image_default_out_of_the_reservations_limits(image, fields, error):
    from provisioning import services as vms

    with pytest.raises(ValidationError) as caught:
        vms.update_image(image, actor=TEST, **fields)

    assert error in caught.value.message_dict


def test_the_reserve_page_takes_gpus_and_shows_the_images_default(client, gpu_host, cuda, alice):
    from django.urls import reverse

    client.force_login(alice)
    page = client.get(reverse("reservations:reserve"), {"image": cuda.pk}).content.decode()
    assert 'name="gpus"' in page and 'name="gpu_model"' in page
    assert "the image's default (1 × nvidia-a100)" in page
    form = {"image": cuda.pk, "when": "now", "duration": "60", "request_key": "7c0e0f3e-1111-4c4c-8a8a-00000000000a"}

    refused = client.post(reverse("reservations:reserve"), {**form, "gpus": "2"})
    assert refused.status_code == 200 and not Reservation.objects.exists()
    assert "lack GPU nvidia-a100" in refused.content.decode()
    answer = client.post(reverse("reservations:reserve"), {**form, "gpus": "1", "gpu_model": "nvidia-a100"})

    assert answer.status_code == 302
    assert (Reservation.objects.get().gpus, Reservation.objects.get().gpu_model) == (1, "nvidia-a100")


def test_the_fit_check_of_the_reserve_page_counts_the_gpus_asked(client, gpu_host, image, alice):
    from django.urls import reverse

    client.force_login(alice)
    ask = {"image": image.pk, "when": "now", "duration": "60"}

    assert 'data-fit="yes"' in client.get(reverse("reservations:fit"), {**ask, "gpus": "1"}).content.decode()
    refused = client.get(reverse("reservations:fit"), {**ask, "gpus": "2"}).content.decode()
    assert 'data-fit="yes"' not in refused and "needs 2 GPUs nvidia-a100" in refused


def test_the_cli_reserves_gpus(gpu_host, image, alice):
    from io import StringIO

    from django.core.management import CommandError, call_command

    def run(*args):
        out = StringIO()
        call_command("reservation", *args, stdout=out)
        return out.getvalue()

    start = later(2).isoformat()
    assert "needs 2 GPUs nvidia-a100" in run("check", "debian-12", "--start", start, "--duration", "60", "--gpus", "2")
    run(
        "create",
        "debian-12",
        "--user",
        "alice",
        "--start",
        start,
        "--duration",
        "60",
        "--gpus",
        "1",
        "--gpu-model",
        "nvidia-a100",
    )
    assert (Reservation.objects.get().gpus, Reservation.objects.get().gpu_model) == (1, "nvidia-a100")
    with pytest.raises(CommandError, match="refused: gpu_model"):
        run("create", "debian-12", "--user", "alice", "--duration", "60", "--gpus", "1", "--gpu-model", "a b")
