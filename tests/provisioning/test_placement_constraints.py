"""Images carry required and forbidden host tags and an anti-affinity group; vm.create's
claim honours them. The fields are checked wherever an image is written."""

import pytest
from django.core.exceptions import ValidationError

from jobs.models import Job
from provisioning import services
from provisioning.models import VM, Image


@pytest.fixture
def hosts(make_host):
    plain, gpu = make_host("plain-1", cpus=64, memory_mib=262144), make_host("gpu-1")  # balanced prefers plain-1
    gpu.tags.add("gpu")
    return plain, gpu


def build(owner, image, sync_jobs):
    vm, job = services.request_vm(actor=owner, owner=owner, image=image)
    sync_jobs.drain()
    return VM.objects.get(pk=vm.pk), Job.objects.get(pk=job.pk)


def test_a_gpu_image_builds_on_the_gpu_host(hosts, image, alice, sync_jobs):
    plain, gpu = hosts
    services.update_image(image, actor="test", required_tags=["gpu"])
    for _ in range(3):
        vm, job = build(alice, image, sync_jobs)
        assert job.status == "success", job.error_message
        assert vm.host == gpu and vm.allocation.host == gpu


def test_a_forbidden_tag_keeps_vms_off_those_hosts(hosts, image, alice, sync_jobs):
    plain, gpu = hosts
    plain.tags.add("shared")
    services.update_image(image, actor="test", forbidden_tags=["shared"])
    for _ in range(2):
        vm, job = build(alice, image, sync_jobs)
        assert job.status == "success" and vm.host == gpu


def test_a_create_with_no_tagged_host_fails_saying_which_tag(hosts, image, alice, sync_jobs):
    services.update_image(image, actor="test", required_tags=["tpu"])
    vm, job = build(alice, image, sync_jobs)
    assert job.status == "error" and "no host has tag tpu" in job.error_message
    assert vm.state == "failed" and "no host has tag tpu" in vm.error


def test_an_anti_affinity_group_puts_each_vm_on_its_own_host(hosts, image, alice, sync_jobs):
    services.update_image(image, actor="test", anti_affinity="replicas")
    placed = []
    for _ in range(2):
        vm, job = build(alice, image, sync_jobs)
        assert job.status == "success", job.error_message
        placed.append(vm.host_id)
        assert vm.allocation.anti_affinity == "replicas"
    assert sorted(placed) == sorted(h.pk for h in hosts)
    vm, job = build(alice, image, sync_jobs)
    assert job.status == "error" and "anti-affinity" in job.error_message


@pytest.mark.parametrize(
    "fields, field, message",
    [
        ({"required_tags": ["a,b"]}, "required_tags", "no comma"),
        ({"required_tags": "x" * 101}, "required_tags", "at most 100"),
        ({"forbidden_tags": [f"t{i}" for i in range(21)]}, "forbidden_tags", "at most 20"),
        ({"forbidden_tags": {"gpu": 1}}, "forbidden_tags", "a list of tag names"),
        ({"required_tags": ["gpu"], "forbidden_tags": ["gpu"]}, "forbidden_tags", "required and forbidden"),
        ({"anti_affinity": "two words"}, "anti_affinity", "a group name"),
    ],
)
def test_it_refuses_bad_placement_fields(image, fields, field, message):
    with pytest.raises(ValidationError) as refused:
        services.update_image(image, actor="test", **fields)
    assert message in " ".join(refused.value.message_dict[field])
    assert Image.objects.get(pk=image.pk).required_tags == []


def test_tags_are_normalised(image):
    services.update_image(image, actor="test", required_tags=[" gpu ", "avx512", "gpu", ""], anti_affinity=" db ")
    image = Image.objects.get(pk=image.pk)
    assert image.required_tags == ["avx512", "gpu"] and image.anti_affinity == "db"


def test_the_api_reads_and_writes_them(api, admin_user, image):
    client = api(admin_user)
    response = client.patch(
        f"/api/v1/images/{image.pk}/", {"required_tags": ["gpu"], "anti_affinity": "db"}, format="json"
    )
    assert response.status_code == 200, response.json()
    assert response.json()["required_tags"] == ["gpu"] and response.json()["anti_affinity"] == "db"
    bad = client.patch(
        f"/api/v1/images/{image.pk}/", {"required_tags": ["gpu"], "forbidden_tags": ["gpu"]}, format="json"
    )
    assert bad.status_code == 400 and "forbidden_tags" in bad.json()["error"]["fields"]


def test_the_form_takes_comma_separated_tags(client, admin_user, image):
    client.force_login(admin_user)
    page = client.get(f"/vms/images/{image.pk}/edit/")
    assert page.status_code == 200 and 'name="required_tags"' in page.content.decode()
    data = {name: getattr(image, name) for name in services.IMAGE_FIELDS if name not in ("parent", "user_data")}
    data = {name: "" if value is None else value for name, value in data.items()}
    data.update(required_tags="gpu, nvme", forbidden_tags="", anti_affinity="lab", revert_on_end="", active="on")
    response = client.post(f"/vms/images/{image.pk}/edit/", data)
    assert response.status_code == 302, response.content.decode()[:2000]
    image = Image.objects.get(pk=image.pk)
    assert image.required_tags == ["gpu", "nvme"] and image.anti_affinity == "lab"
    assert "only hosts tagged gpu, nvme" in client.get(f"/vms/images/{image.pk}/").content.decode()


def test_the_admin_shows_them(client, admin_user, image):
    services.update_image(image, actor="test", required_tags=["gpu", "nvme"])
    client.force_login(admin_user)
    page = client.get(f"/admin/vms/image/{image.pk}/change/").content.decode()
    assert 'name="required_tags"' in page and 'value="gpu, nvme"' in page and 'name="anti_affinity"' in page


def test_an_exclusive_storage_image_builds_only_in_such_a_group(make_host, image, alice, sync_jobs, api):
    from inventory.models import NodeGroup

    make_host("shared-1", cpus=64, memory_mib=262144)
    own = make_host("own-1", group=NodeGroup.objects.create(name="spindles", exclusive_storage=True))
    services.update_image(image, actor="test", exclusive_storage=True)
    vm, job = build(alice, image, sync_jobs)
    assert job.status == "success" and vm.host == own
    too_big = {"vcpus": 1, "memory_mib": 100_000, "exclusive_storage": True}  # shared-1 has room, own-1 not
    answer = api(alice).post("/api/v1/placement/plan/", too_big, format="json").json()
    assert not answer["fits"] and answer["reasons"] == {"exclusive_storage": 1, "lacks_memory_mib": 1}
