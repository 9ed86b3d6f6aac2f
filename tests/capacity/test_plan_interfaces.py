import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from capacity import services as capacity
from tests.conftest import TEST
from tests.images import sim_image

pytestmark = pytest.mark.django_db


def test_the_api_plans_without_claiming(api, admin_user, make_host):
    make_host("h1", cpus=4)
    body = api(admin_user).post("/api/v1/placement/plan/", {"vcpus": 2, "memory_mib": 1024, "duration": "2h"}).json()
    assert body["fits"] and body["host"] == "h1"
    from capacity.models import Allocation

    assert not Allocation.objects.exists()


def test_users_get_the_answer_without_host_names(api, alice, make_host):
    make_host("h1", cpus=1, cpu_ratio=1.0)
    client = api(alice)
    assert client.post("/api/v1/placement/plan/", {"vcpus": 1, "memory_mib": 1}).json()["host"] is None
    now = timezone.now()
    hour = capacity.Demand(vcpus=1, memory_mib=1, disk_gib=0, start=now, end=now + timedelta(hours=1))
    capacity.claim(hour, actor=TEST)
    body = client.post("/api/v1/placement/plan/", {"vcpus": 1, "memory_mib": 1, "duration": "1h"}).json()
    assert not body["fits"]
    assert body["summary"].startswith("no host: 1 lack vcpus; earliest fit ")
    assert body["earliest_fit"]["host"] is None and body["closest_misses"] == []


def test_the_api_rejects_nonsense(api, alice):
    response = api(alice).post("/api/v1/placement/plan/", {"vcpus": -1, "memory_mib": 1, "duration": "soon"})
    assert response.status_code == 400
    assert set(response.json()["error"]["fields"]) == {"vcpus", "duration"}


def test_the_place_command_explains_a_refusal(make_host, capsys):
    make_host("h1", cpus=2, cpu_ratio=1.0)
    with pytest.raises(SystemExit) as exited:
        call_command("place", "--vcpus", "4", "--memory", "512", "--duration", "2h")
    assert exited.value.code == 1
    assert "no host: 1 lack vcpus" in capsys.readouterr().out
    call_command("place", "--vcpus", "2", "--memory", "512", "--json")
    assert json.loads(capsys.readouterr().out)["host"] == "h1"


def test_the_api_plans_for_an_image_and_refuses_unknown_fields(api, alice, make_host):
    from provisioning import services as vms

    make_host("kvm1", driver="libvirt")
    image = vms.create_image(actor="test", name="win11", min_memory_mib=256, default_memory_mib=512)
    vms.add_variant(
        image, actor="test", hypervisor_type="vmware", format="vmdk", location="ds://win11.vmdk", size_gib=20
    )
    body = api(alice).post("/api/v1/placement/plan/", {"vcpus": 1, "memory_mib": 512, "image": "win11"}).json()
    assert not body["fits"] and body["reasons"] == {"wrong_hypervisor": 1}  # only a VMware host could run it
    response = api(alice).post("/api/v1/placement/plan/", {"vcpus": 1, "memory_mib": 512, "image": "nosuch"})
    assert response.status_code == 400 and "no image named 'nosuch'" in str(response.json()["error"]["fields"]["image"])
    response = api(alice).post("/api/v1/placement/plan/", {"vcpus": 1, "memory": 512, "memory_mib": 512})
    assert response.status_code == 400 and response.json()["error"]["fields"]["memory"] == ["unknown field"]


def test_the_place_command_refuses_the_past_and_impossible_dates_and_shows_closest_misses(make_host, capsys):
    make_host("h1", cpus=2, cpu_ratio=1.0, memory_mib=4096)
    with pytest.raises(CommandError, match="is in the past"):
        call_command("place", "--vcpus", "1", "--memory", "512", "--start", "2020-01-01 10:00", "--duration", "2h")
    with pytest.raises(CommandError, match=r"not a valid date and time: '2026-13-45 09:00' \(month must be in 1\.\.12"):
        call_command("place", "--vcpus", "1", "--memory", "512", "--start", "2026-13-45 09:00")
    with pytest.raises(SystemExit):
        call_command("place", "--vcpus", "1", "--memory", "6144")
    assert "closest: h1, short of" in capsys.readouterr().out
    later = (timezone.now() + timedelta(days=1)).strftime("%Y-%m-%d %H:%M")
    call_command("place", "--vcpus", "1", "--memory", "512", "--start", later, "--json")
    body = json.loads(capsys.readouterr().out)
    assert body["fits"] and body["host"] == "h1"


def test_the_api_refuses_a_start_in_the_past(api, alice):
    body = {"vcpus": 1, "memory_mib": 1, "start": "2020-01-01T10:00:00Z"}
    response = api(alice).post("/api/v1/placement/plan/", body)
    assert response.status_code == 400 and "in the past" in str(response.json()["error"]["fields"]["start"])


def test_place_save_writes_an_input_that_replays_to_the_same_answer(make_host, capsys, tmp_path):
    from placement.serialize import replay

    make_host("h1", cpus=4)
    make_host("h2", cpus=8)
    saved = tmp_path / "decision.json"
    call_command("place", "--vcpus", "2", "--memory", "512", "--duration", "2h", "--json", "--save", str(saved))
    answer = json.loads(capsys.readouterr().out)
    record = json.loads(saved.read_text())
    assert set(record) == {"note", "cluster", "requests", "options", "expected"}  # the golden files' format
    assert replay(record) == record["expected"]
    assert record["expected"][0]["host"] == answer["host"] and answer["fits"]
    refused = tmp_path / "refused.json"
    with pytest.raises(SystemExit):
        call_command("place", "--vcpus", "64", "--memory", "512", "--save", str(refused))
    record = json.loads(refused.read_text())
    assert replay(record) == record["expected"] and record["expected"][0]["host"] is None


def test_a_restricted_image_name_answers_as_an_unknown_one(api, alice, admin_user, make_host):
    """Users must not learn which restricted images exist."""

    make_host("h1")
    sim_image(
        "secret-lab",
        location="sim://s",
        size_gib=1,
        min_memory_mib=256,
        default_memory_mib=512,
        visibility="restricted",
    )
    plan = {"vcpus": 1, "memory_mib": 512}

    restricted = api(alice).post("/api/v1/placement/plan/", {**plan, "image": "secret-lab"})
    unknown = api(alice).post("/api/v1/placement/plan/", {**plan, "image": "no-such-lab"})

    assert (restricted.status_code, unknown.status_code) == (400, 400)
    fields = restricted.json()["error"]["fields"]["image"], unknown.json()["error"]["fields"]["image"]
    assert fields[0] == [m.replace("no-such-lab", "secret-lab") for m in fields[1]]
    assert api(admin_user).post("/api/v1/placement/plan/", {**plan, "image": "secret-lab"}).status_code == 200
