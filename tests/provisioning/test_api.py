"""The VM and image API: who sees what, actions answer 202 with a job, bad input gets 400."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from drivers.sim.models import SimFault
from jobs.models import Job
from provisioning import services
from provisioning.models import VM, Image
from tests.images import sim_image


@pytest.fixture
def restricted(db):
    group = Group.objects.create(name="course-101")
    image = sim_image(
        "secret-lab",
        location="sim://library/secret",
        size_gib=0,
        visibility="restricted",
        groups=[group],
        min_memory_mib=256,
        default_memory_mib=512,
    )
    return image, group


def names(response):
    return sorted(item["name"] for item in response.json()["results"])


def test_users_see_public_images_and_their_groups_only(api, alice, bob, admin_user, image, restricted):
    secret, group = restricted
    clients = {user: api(user) for user in (alice, bob, admin_user)}
    Image.objects.create(name="retired", active=False)
    alice.groups.add(group)
    assert names(clients[alice].get("/api/v1/images/")) == ["debian-12", "secret-lab"]
    assert names(clients[bob].get("/api/v1/images/")) == ["debian-12"]
    assert clients[bob].get(f"/api/v1/images/{secret.pk}/").status_code == 404
    assert names(clients[admin_user].get("/api/v1/images/")) == ["debian-12", "retired", "secret-lab"]


def test_only_staff_manage_images(api, alice, admin_user, image):
    clients = {user: api(user) for user in (alice, admin_user)}
    body = {"name": "ubuntu-24.04", "os": "Ubuntu", "min_memory_mib": 512, "default_memory_mib": 2048}
    assert clients[alice].post("/api/v1/images/", body, format="json").status_code == 403
    response = clients[admin_user].post("/api/v1/images/", body, format="json")
    assert response.status_code == 201, response.json()
    image_id = response.json()["id"]
    bad = clients[admin_user].post(
        "/api/v1/image-variants/",
        {"image": image_id, "hypervisor_type": "kvm", "format": "vmdk", "location": "/x.vmdk"},
        format="json",
    )
    assert bad.status_code == 400 and "format" in str(bad.json())
    good = clients[admin_user].post(
        "/api/v1/image-variants/",
        {"image": image_id, "hypervisor_type": "sim", "format": "sim", "location": "sim://l/u"},
        format="json",
    )
    assert good.status_code == 201, good.json()
    assert clients[alice].get("/api/v1/image-variants/").status_code == 403


def test_it_rejects_a_default_below_the_minimum(api, admin_user):
    response = api(admin_user).post("/api/v1/images/", {"name": "x", "min_vcpus": 4, "default_vcpus": 2}, format="json")
    assert response.status_code == 400 and "default_vcpus" in str(response.json())


def test_a_user_requests_and_drives_their_vm(api, alice, bob, sim_host, image, sync_jobs):
    clients = {user: api(user) for user in (alice, bob)}
    response = clients[alice].post("/api/v1/vms/", {"image": image.pk, "memory_mib": 1024}, format="json")
    assert response.status_code == 202, response.json()
    vm_id, job_id = response.json()["vm"], response.json()["job"]
    sync_jobs.drain()
    assert Job.objects.get(pk=job_id).status == "success"
    detail = clients[alice].get(f"/api/v1/vms/{vm_id}/").json()
    assert detail["state"] == "running" and detail["owner"] == "alice" and detail["address"]
    assert clients[bob].get(f"/api/v1/vms/{vm_id}/").status_code == 404
    assert clients[bob].post(f"/api/v1/vms/{vm_id}/stop/").status_code == 404
    assert clients[bob].get("/api/v1/vms/").json()["count"] == 0
    assert api(alice, write=False).post(f"/api/v1/vms/{vm_id}/stop/").status_code == 403
    for verb, state in (
        ("stop", "stopped"),
        ("start", "running"),
        ("suspend", "suspended"),
        ("resume", "running"),
        ("destroy", "destroyed"),
    ):
        response = clients[alice].post(f"/api/v1/vms/{vm_id}/{verb}/")
        assert response.status_code == 202, response.json()
        sync_jobs.drain()
        assert Job.objects.get(pk=response.json()["job"]).status == "success"
        assert VM.objects.get(pk=vm_id).state == state
    assert clients[alice].post(f"/api/v1/vms/{vm_id}/start/").status_code == 409


def test_it_refuses_an_image_the_user_may_not_use(api, bob, sim_host, restricted):
    secret, _ = restricted
    response = api(bob).post("/api/v1/vms/", {"image": secret.pk}, format="json")
    assert response.status_code == 400 and "image" in str(response.json())
    assert not VM.objects.exists()


def test_it_refuses_a_size_below_the_image_minimum(api, alice, sim_host, image):
    response = api(alice).post("/api/v1/vms/", {"image": image.pk, "memory_mib": 64}, format="json")
    assert response.status_code == 400 and "memory_mib" in str(response.json())
    assert not VM.objects.exists() and not Job.objects.exists()


def test_staff_inject_and_clear_sim_faults(api, alice, admin_user, sim_host, make_host):
    clients = {user: api(user) for user in (alice, admin_user)}
    url = f"/api/v1/hypervisors/{sim_host.pk}/sim-faults/"
    assert clients[alice].post(url, {"step": "create", "mode": "fail"}, format="json").status_code == 403
    response = clients[admin_user].post(url, {"step": "create", "mode": "fail"}, format="json")
    assert response.status_code == 201, response.json()
    assert [f["step"] for f in clients[admin_user].get(url).json()] == ["create"]
    assert clients[admin_user].post(url, {"step": "nope", "mode": "fail"}, format="json").status_code == 400
    assert clients[admin_user].delete(url).status_code == 204
    assert not SimFault.objects.exists()
    kvm = make_host("kvm-1", driver="libvirt")
    assert clients[admin_user].get(f"/api/v1/hypervisors/{kvm.pk}/sim-faults/").status_code == 409


def test_a_vm_with_an_end_in_the_past_is_refused(api, alice, image):
    past = (timezone.now() - timedelta(hours=1)).isoformat()
    response = api(alice).post("/api/v1/vms/", {"image": image.pk, "end": past}, format="json")
    assert response.status_code == 400 and "end" in response.json()["error"]["fields"], response.content[:300]
    assert not VM.objects.exists()


def test_variants_filter_by_format_and_the_parameter_does_not_pick_a_renderer(api, admin_user, image):
    services.add_variant(image, actor=admin_user, hypervisor_type="kvm", format="qcow2", location="/i.qcow2")
    response = api(admin_user).get("/api/v1/image-variants/?format=qcow2")
    assert response.status_code == 200, response.content[:300]
    assert [v["format"] for v in response.json()["results"]] == ["qcow2"]
    assert api(admin_user).get("/api/v1/image-variants/?format=raw").json()["results"] == []


def test_an_operator_resizes_a_users_vm(api, alice, admin_user, sim_host, image, sync_jobs):
    vm, _ = services.request_vm(actor=alice, owner=alice, image=image, memory_mib=1024)
    sync_jobs.drain()
    client = api(admin_user)

    response = client.post(f"/api/v1/vms/{vm.pk}/resize/", {"vcpus": 2, "memory_mib": 2048}, format="json")

    assert response.status_code == 202, response.json()
    sync_jobs.drain()
    job = Job.objects.get(pk=response.json()["job"])
    assert job.status == "success" and job.result["applies"] == "next boot"
    vm.refresh_from_db()
    assert (vm.vcpus, vm.memory_mib, vm.allocation.vcpus, vm.allocation.memory_mib) == (2, 2048, 2, 2048)
    assert client.post(f"/api/v1/vms/{vm.pk}/resize/", {"vcpus": 1}, format="json").status_code == 409
    for body in ({}, {"vcpus": 0}, {"memory_mib": 128}, {"disk_gib": 20}):
        assert client.post(f"/api/v1/vms/{vm.pk}/resize/", body, format="json").status_code == 400, body
    assert api(alice).post(f"/api/v1/vms/{vm.pk}/resize/", {"vcpus": 4}, format="json").status_code == 403
    assert Job.objects.filter(opcode="vm.resize").count() == 1
