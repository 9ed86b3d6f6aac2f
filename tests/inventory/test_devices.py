"""A host's GPUs: validated, shown in the API, filled by the driver's facts, fed to placement."""

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from capacity import loaders
from core.models import ObjectChange
from inventory import services
from inventory.devices import device_errors, gpu_counts
from provisioning.opcodes import host_ops
from tests.conftest import TEST

pytestmark = pytest.mark.django_db

A100 = {"kind": "gpu", "vendor": "nvidia", "model": "nvidia-a100", "count": 2}


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ({"model": "x"}, "must be a JSON list"),
        ([{"kind": "usb", "model": "x"}], "kind must be one of gpu, mdev"),
        ([{"model": "a b"}], "model must be a name"),
        ([{"model": "x", "count": -1}], "count must be a whole number"),
        ([{"model": "x", "count": True}], "count must be a whole number"),
        ([{"model": "x"}, {"model": "x"}], "device 2: model x is listed twice"),
        ([{"model": "x", "colour": "red"}], "unknown field 'colour'"),
    ],
)
def test_it_rejects_a_malformed_device_list(value, words):
    assert words in device_errors(value)


def test_it_counts_gpus_and_vgpu_instances_per_model():
    devices = [A100, {"kind": "mdev", "model": "nvidia-t4-2q", "count": 8}, {"model": "old", "count": 0}]
    assert device_errors(devices) is None
    assert gpu_counts(devices) == {"nvidia-a100": 2, "nvidia-t4-2q": 8}


def test_it_rejects_bad_devices_on_create(make_host):
    with pytest.raises(ValidationError) as refused:
        make_host("h1", devices=[{"kind": "gpu"}])
    assert "devices" in refused.value.message_dict


def test_the_api_shows_and_sets_a_hosts_devices(make_host, api, admin_user):
    host = make_host("h1", devices=[A100])
    client = api(admin_user)
    assert client.get(f"/api/v1/hypervisors/{host.pk}/").json()["devices"] == [A100]
    answer = client.patch(f"/api/v1/hypervisors/{host.pk}/", {"devices": [{"model": "nvidia-t4"}]}, format="json")
    assert answer.status_code == 200, answer.content
    host.refresh_from_db()
    assert host.devices == [{"model": "nvidia-t4"}]
    bad = client.patch(f"/api/v1/hypervisors/{host.pk}/", {"devices": [{"count": 1}]}, format="json")
    assert bad.status_code == 400, bad.content
    assert "device 1: model must be a name" in bad.json()["error"]["fields"]["devices"][0]


def test_a_refresh_fills_the_devices_the_sim_driver_reports(make_host):
    host = make_host("sim-gpu", driver_options={"gpus": {"nvidia-a100": 1, "nvidia-t4": 2}})
    host_ops.refresh_facts(host.pk, actor=TEST)
    host.refresh_from_db()
    assert gpu_counts(host.devices) == {"nvidia-a100": 1, "nvidia-t4": 2}
    assert host.facts["devices"] == host.devices
    logged = ObjectChange.objects.filter(object_id=str(host.pk), reason="devices reported by the driver")
    assert logged.count() == 1
    host_ops.refresh_facts(host.pk, actor=TEST)  # nothing new: no second change-log row
    assert logged.count() == 1


def test_a_driver_that_cannot_tell_leaves_the_devices_alone(make_host):
    host = make_host("h1", devices=[A100])
    services.report_facts(host, {"cpus": 16, "devices": None}, actor=TEST)
    host.refresh_from_db()
    assert host.devices == [A100]


def test_the_loader_gives_placement_the_gpus_per_model(make_host):
    make_host("h1", devices=[A100, {"kind": "mdev", "model": "nvidia-t4-2q", "count": 4}])
    make_host("h2")
    cluster, _ids = loaders.load_cluster(timezone.now())
    totals = {h.name: dict(h.total.extras) for h in cluster.hosts}
    assert totals == {"h1": {"gpu:nvidia-a100": 2, "gpu:nvidia-t4-2q": 4}, "h2": {}}
