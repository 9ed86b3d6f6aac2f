"""The image library and VM pages: who sees what, forms and their bad input, actions as jobs."""

import pytest
from django.contrib.auth.models import Group

from core.models import ObjectChange
from jobs.models import Job
from provisioning import services
from provisioning.models import VM, Image, ImageVariant

pytestmark = pytest.mark.django_db


@pytest.fixture
def running_vm(sim_host, image, alice, sync_jobs):
    vm, _ = services.request_vm(actor=alice, owner=alice, image=image)
    sync_jobs.drain()
    vm.refresh_from_db()
    assert vm.state == "running", vm.error
    return vm


def page(client, user, url, status=200):
    client.force_login(user)
    response = client.get(url)
    assert response.status_code == status
    return response.content.decode()


# --- permissions ------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["/vms/", "/vms/1/", "/vms/images/", "/vms/images/1/", "/vms/images/new/"])
def test_anonymous_visitors_are_sent_to_the_login(client, url):
    response = client.get(url)
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_a_stranger_gets_404_for_someone_elses_vm_and_its_actions(client, running_vm, bob, sync_jobs):
    page(client, bob, f"/vms/{running_vm.pk}/", status=404)
    assert client.post(f"/vms/{running_vm.pk}/action/", {"action": "destroy"}).status_code == 404
    assert not Job.objects.filter(opcode="vm.destroy").exists()
    assert running_vm.key not in page(client, bob, "/vms/")


def test_ids_beyond_the_column_range_are_404(client, alice):
    page(client, alice, f"/vms/{2**64}/", status=404)
    page(client, alice, f"/vms/images/{2**64}/", status=404)


def test_users_see_only_images_they_may_use(client, image, alice, bob):
    staff = Group.objects.create(name="staff-only")
    secret = services.create_image(actor="test", name="secret-img", visibility="restricted", groups=[staff])
    services.create_image(actor="test", name="old-img", active=False)
    listing = page(client, alice, "/vms/images/")
    assert "debian-12" in listing and "secret-img" not in listing and "old-img" not in listing
    page(client, alice, f"/vms/images/{secret.pk}/", status=404)
    alice.groups.add(staff)
    assert "secret-img" in page(client, alice, "/vms/images/")


@pytest.mark.parametrize(
    "method, url",
    [
        ("get", "/vms/images/new/"),
        ("get", "/vms/images/{image}/edit/"),
        ("post", "/vms/images/{image}/delete/"),
        ("post", "/vms/images/{image}/variants/"),
        ("post", "/vms/variants/{variant}/delete/"),
    ],
)
def test_only_staff_manage_the_library(client, image, alice, method, url):
    client.force_login(alice)
    url = url.format(image=image.pk, variant=image.variants.get().pk)
    assert getattr(client, method)(url).status_code == 403
    assert Image.objects.filter(pk=image.pk).exists() and image.variants.count() == 1


def test_forms_are_csrf_protected(image, admin_user):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    assert client.post(f"/vms/images/{image.pk}/delete/").status_code == 403
    form = client.get(f"/vms/images/{image.pk}/").content.decode()
    assert form.count("csrfmiddlewaretoken") >= 3  # delete image, delete variant, add variant


# --- the image library ------------------------------------------------------------------


def test_the_library_filters_by_search_os_and_platform(client, image, alice):
    services.create_image(actor="test", name="alma-9", os="AlmaLinux 9", platform="aarch64", description="for ARM labs")
    listing = page(client, alice, "/vms/images/?os=Debian+12")
    assert "debian-12" in listing and "alma-9" not in listing
    listing = page(client, alice, "/vms/images/?platform=aarch64")
    assert "alma-9" in listing and "debian-12" not in listing
    listing = page(client, alice, "/vms/images/?q=arm+labs")
    assert "alma-9" in listing and "debian-12" not in listing
    assert '<option value="AlmaLinux 9">' in listing  # the OS choices come from the library


def test_the_library_shows_variants_and_derived_images_with_their_parent(client, image, alice):
    child = services.create_image(actor="test", name="debian-12-matlab", os="Debian 12", parent=image)
    listing = page(client, alice, "/vms/images/")
    assert "sim · sim" in listing
    row = listing.split(f'id="image-{child.pk}"')[1].split("</tr>")[0]
    assert f'href="/vms/images/{image.pk}/"' in row
    detail = page(client, alice, f"/vms/images/{image.pk}/")
    assert "debian-12-matlab" in detail and "Delete image" not in detail and "Change log" not in detail


def test_staff_create_edit_and_delete_an_image(client, admin_user):
    client.force_login(admin_user)
    data = {
        "name": "ubuntu-24.04",
        "os": "Ubuntu 24.04",
        "platform": "x86_64",
        "min_vcpus": 1,
        "min_memory_mib": 512,
        "min_disk_gib": 1,
        "default_vcpus": 2,
        "default_memory_mib": 2048,
        "default_disk_gib": 20,
        "visibility": "public",
        "active": "on",
    }
    response = client.post("/vms/images/new/", data)
    image = Image.objects.get(name="ubuntu-24.04")
    assert response.status_code == 302 and response["Location"] == f"/vms/images/{image.pk}/"
    response = client.post(f"/vms/images/{image.pk}/edit/", {**data, "default_vcpus": 4})
    assert response.status_code == 302
    image.refresh_from_db()
    assert image.default_vcpus == 4
    change = ObjectChange.objects.filter(object_id=str(image.pk), action="update").get()
    assert change.changes["default_vcpus"] == [2, 4] and change.actor == "admin"
    client.post(f"/vms/images/{image.pk}/delete/")
    assert not Image.objects.filter(pk=image.pk).exists()


@pytest.mark.parametrize(
    "change, field, message",
    [
        ({"name": "has space"}, "name", "use letters, digits"),
        ({"name": "debian-12"}, "name", "already exists"),
        ({"default_vcpus": 1, "min_vcpus": 4}, "default_vcpus", "must be at least min_vcpus"),
        ({"min_memory_mib": 1}, "min_memory_mib", "greater than or equal to 16"),
        ({"visibility": "everyone"}, "visibility", "Select a valid choice"),
    ],
)
def test_bad_image_input_shows_errors_and_saves_nothing(client, admin_user, image, change, field, message):
    client.force_login(admin_user)
    data = {
        "name": "new-img",
        "platform": "x86_64",
        "min_vcpus": 1,
        "min_memory_mib": 512,
        "min_disk_gib": 1,
        "default_vcpus": 1,
        "default_memory_mib": 1024,
        "default_disk_gib": 10,
        "visibility": "public",
        **change,
    }
    response = client.post("/vms/images/new/", data)
    assert response.status_code == 200
    assert field in response.context["form"].errors
    assert message in " ".join(response.context["form"].errors[field])
    assert Image.objects.count() == 1


def test_an_image_cannot_become_its_own_parent(client, admin_user, image):
    client.force_login(admin_user)
    response = client.get(f"/vms/images/{image.pk}/edit/")
    assert image not in response.context["form"].fields["parent"].queryset


def test_staff_add_and_delete_variants_with_clear_errors(client, admin_user, image):
    client.force_login(admin_user)
    url = f"/vms/images/{image.pk}/variants/"
    good = {"hypervisor_type": "kvm", "format": "qcow2", "location": "/srv/images/debian-12.qcow2", "size_gib": 2}
    assert client.post(url, good).status_code == 302
    kvm = image.variants.get(hypervisor_type="kvm")
    for bad, message in (
        (good, "already has a kvm variant"),
        ({**good, "hypervisor_type": "vmware", "format": "qcow2"}, "vmware hosts run vmdk or template"),
        ({**good, "hypervisor_type": "vmware", "format": "floppy"}, "format: Select a valid choice"),
    ):
        body = client.post(url, bad, follow=True).content.decode()
        assert message in body, message
    assert image.variants.count() == 2
    client.post(f"/vms/variants/{kvm.pk}/delete/")
    assert not ImageVariant.objects.filter(pk=kvm.pk).exists()


def test_an_image_in_use_is_not_deleted(client, admin_user, running_vm):
    client.force_login(admin_user)
    body = client.post(f"/vms/images/{running_vm.image_id}/delete/", follow=True).content.decode()
    assert "deactivate it instead" in body and Image.objects.filter(pk=running_vm.image_id).exists()
    body = client.post(f"/vms/variants/{running_vm.variant_id}/delete/", follow=True).content.decode()
    assert "used by live VMs" in body


# --- VMs --------------------------------------------------------------------------------


def test_the_vm_list_shows_own_vms_and_subscribes_to_the_users_topic(client, running_vm, alice, admin_user):
    listing = page(client, alice, "/vms/")
    assert f'id="vm-{running_vm.pk}"' in listing and running_vm.address in listing
    assert f'data-topics="user.{alice.pk}"' in listing and "js/pages/vm_list.js" in listing
    listing = page(client, admin_user, "/vms/?state=running")
    assert f'id="vm-{running_vm.pk}"' in listing and 'data-topics="admin"' in listing
    assert f'id="vm-{running_vm.pk}"' not in page(client, admin_user, "/vms/?state=stopped")


def test_the_vm_page_shows_state_host_address_history_and_jobs(client, running_vm, alice):
    detail = page(client, alice, f"/vms/{running_vm.pk}/")
    assert running_vm.host.name in detail and running_vm.address in detail
    assert "staging" in detail and "Change log" in detail  # the history of its states
    assert f'data-id="{running_vm.pk}"' in detail and "js/pages/vm_detail.js" in detail and "vm.create" in detail
    for action in ("Stop", "Suspend", "Snapshot", "Destroy"):
        assert f">{action}</button>" in detail
    assert ">Start</button>" not in detail and ">Revert</button>" not in detail  # nothing to revert to yet


def test_actions_submit_jobs_and_link_to_them(client, running_vm, alice, sync_jobs):
    client.force_login(alice)
    for action, state in (("suspend", "suspended"), ("resume", "running"), ("stop", "stopped")):
        response = client.post(f"/vms/{running_vm.pk}/action/", {"action": action}, follow=True)
        job = Job.objects.latest("id")
        assert job.opcode == f"vm.{action}" and job.submitter == alice
        assert f'href="/provisioning/jobs/{job.pk}/"' in response.content.decode()
        sync_jobs.drain()
        assert VM.objects.get(pk=running_vm.pk).state == state
    client.post(f"/vms/{running_vm.pk}/action/", {"action": "snapshot", "name": "clean"})
    sync_jobs.drain()
    assert ">Revert</button>" in page(client, alice, f"/vms/{running_vm.pk}/")
    client.post(f"/vms/{running_vm.pk}/action/", {"action": "revert", "name": "clean"})
    client.post(f"/vms/{running_vm.pk}/action/", {"action": "destroy"})
    sync_jobs.drain()
    assert [j.status for j in Job.objects.filter(opcode__in=("vm.revert", "vm.destroy"))] == ["success", "success"]
    assert VM.objects.get(pk=running_vm.pk).state == "destroyed"


@pytest.mark.parametrize(
    "data, message",
    [
        ({"action": "reboot"}, "Select a valid choice"),
        ({"action": "snapshot", "name": "no spaces"}, "snapshot name"),
        ({"action": "revert"}, "snapshot name"),
    ],
)
def test_bad_actions_show_errors_and_submit_nothing(client, running_vm, alice, data, message):
    client.force_login(alice)
    before = Job.objects.count()
    body = client.post(f"/vms/{running_vm.pk}/action/", data, follow=True).content.decode()
    assert message in body
    assert Job.objects.count() == before


def test_a_vm_being_built_refuses_actions(client, image, alice, sync_jobs):
    vm, _ = services.request_vm(actor=alice, owner=alice, image=image)  # no host: it stays requested
    client.force_login(alice)
    body = client.post(f"/vms/{vm.pk}/action/", {"action": "stop"}, follow=True).content.decode()
    assert "cannot stop vcl-" in body and "No action while the VM is requested" not in body
    assert not Job.objects.filter(opcode="vm.stop").exists()


def test_a_destroyed_vm_offers_no_action(client, running_vm, alice, sync_jobs):
    services.submit_action(running_vm, "destroy", actor=alice)
    sync_jobs.drain()
    detail = page(client, alice, f"/vms/{running_vm.pk}/")
    assert "No action while the VM is destroyed" in detail
    body = client.post(f"/vms/{running_vm.pk}/action/", {"action": "destroy"}, follow=True).content.decode()
    assert "is destroyed" in body


# --- query budgets ----------------------------------------------------------------------


def _many(image, owners, n):
    for i in range(n):
        VM.objects.create(
            name=f"vm-{i}",
            image=image,
            owner=owners[i % len(owners)],
            vcpus=1,
            memory_mib=512,
            disk_gib=1,
            state="running",
            address=f"10.9.0.{i + 1}",
        )


def test_the_vm_list_runs_a_fixed_number_of_queries(
    client, image, alice, admin_user, sim_host, django_assert_max_num_queries
):
    _many(image, [alice, admin_user], 30)
    VM.objects.update(host=sim_host)
    client.force_login(admin_user)
    with django_assert_max_num_queries(8):
        assert client.get("/vms/").status_code == 200
    client.force_login(alice)
    with django_assert_max_num_queries(8):
        assert client.get("/vms/").status_code == 200


def test_the_image_list_runs_a_fixed_number_of_queries(client, image, alice, admin_user, django_assert_max_num_queries):
    for i in range(20):
        child = services.create_image(actor="test", name=f"img-{i}", os=f"OS {i % 3}", parent=image)
        services.add_variant(child, actor="test", hypervisor_type="kvm", format="qcow2", location=f"/srv/{i}.qcow2")
    for user in (admin_user, alice):
        client.force_login(user)
        with django_assert_max_num_queries(10):
            assert client.get("/vms/images/").status_code == 200


def test_an_operator_resizes_from_the_vm_page_and_its_owner_sees_no_form(
    client, running_vm, alice, admin_user, sync_jobs
):
    assert 'id="vm-resize"' not in page(client, alice, f"/vms/{running_vm.pk}/")
    assert client.post(f"/vms/{running_vm.pk}/resize/", {"vcpus": 4}).status_code == 302
    assert not Job.objects.filter(opcode="vm.resize").exists()
    assert 'id="vm-resize"' in page(client, admin_user, f"/vms/{running_vm.pk}/")

    client.post(f"/vms/{running_vm.pk}/resize/", {"vcpus": 2, "memory_mib": running_vm.memory_mib * 2})
    sync_jobs.drain()

    running_vm.refresh_from_db()
    assert (running_vm.vcpus, running_vm.allocation.vcpus) == (2, 2)
    response = client.post(f"/vms/{running_vm.pk}/resize/", {"vcpus": 1}, follow=True)
    assert "stop it to make it smaller" in response.content.decode()
