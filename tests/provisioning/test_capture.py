"""vm.capture: a VM becomes a new image (with its parent) in the library — sim, libvirt, API, CLI."""

from io import StringIO

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.management import call_command

from accounts import access
from drivers import registry as drivers
from drivers.sim.models import SimImage, SimVM
from jobs.models import Job
from provisioning import services
from provisioning.models import VM, Image
from tests.images import image_maintainer
from tests.provisioning.test_libvirt import kvm_host, kvm_image  # noqa: F401 (fixtures)


def built(owner, image, sync_jobs):
    vm, job = services.request_vm(actor=owner, owner=owner, image=image)
    sync_jobs.drain()
    assert Job.objects.get(pk=job.pk).status == "success", Job.objects.get(pk=job.pk).error_message
    return VM.objects.get(pk=vm.pk)


def capture(actor, vm, name, sync_jobs, **params):
    job = services.submit_action(VM.objects.get(pk=vm.pk), "capture", actor=actor, image_name=name, **params)
    sync_jobs.drain()
    return Job.objects.get(pk=job.pk)


def test_it_stops_a_running_vm_and_captures_it_as_a_derived_image(sim_host, image, admin_user, sync_jobs):
    group = Group.objects.create(name="lab")
    services.update_image(image, actor="test", visibility="restricted", groups=[group])
    vm = built(admin_user, image, sync_jobs)
    job = capture(admin_user, vm, "debian-12-custom", sync_jobs)
    assert job.status == "success", job.error_message
    assert [s["name"] for s in job.steps] == ["stop", "capture", "register"]
    vm = VM.objects.get(pk=vm.pk)
    assert vm.state == "stopped" and SimVM.objects.get(key=vm.key).state == "stopped"
    new = Image.objects.get(name="debian-12-custom")
    assert job.result["image"] == new.pk and new.parent == image and list(new.derived.all()) == []
    assert list(image.derived.all()) == [new]
    assert new.visibility == "restricted" and list(new.groups.all()) == [group]  # staff: inherits
    assert (new.default_memory_mib, new.default_disk_gib) == (vm.memory_mib, vm.disk_gib)
    variant = new.variants.get()
    assert (variant.hypervisor_type, variant.format) == ("sim", "sim")
    assert SimImage.objects.filter(captured_from=vm.key).count() == 1
    # The captured image boots a new VM.
    assert built(admin_user, new, sync_jobs).state == "running"


def test_a_users_capture_is_kept_from_other_users(sim_host, image, alice, bob, sync_jobs):
    vm = built(alice, image, sync_jobs)
    job = capture(alice, vm, "alice-work", sync_jobs)
    assert job.status == "success", job.error_message
    new = Image.objects.get(name="alice-work")
    assert new.visibility == "restricted" and not new.groups.exists()
    assert not services.visible_images(bob).filter(pk=new.pk).exists()


@pytest.fixture
def maintainer(db):
    """An image maintainer of ``lab`` (through the ``image-maintainer`` role group)."""
    return image_maintainer(Group.objects.create(name="lab"))


def test_a_maintainers_capture_of_their_groups_image_keeps_only_their_groups(
    sim_host, image, maintainer, bob, sync_jobs
):
    lab, other = Group.objects.get(name="lab"), Group.objects.create(name="other-course")
    services.update_image(image, actor="test", visibility="restricted", groups=[lab, other])
    job = capture(maintainer, built(maintainer, image, sync_jobs), "lab-custom", sync_jobs)
    assert job.status == "success", job.error_message
    new = Image.objects.get(name="lab-custom")
    # What they could give it by hand (access.check_image_maintenance): their groups, only those.
    assert new.visibility == "restricted" and list(new.groups.all()) == [lab]
    assert access.can_maintain_image(maintainer, new)
    other.user_set.add(bob)
    assert not services.visible_images(bob).filter(pk=new.pk).exists()


def test_a_maintainers_capture_of_a_public_image_never_becomes_public(sim_host, image, maintainer, bob, sync_jobs):
    assert image.visibility == "public" and not image.groups.exists()
    job = capture(maintainer, built(maintainer, image, sync_jobs), "lab-from-public", sync_jobs)
    assert job.status == "success", job.error_message
    new = Image.objects.get(name="lab-from-public")
    # Their own groups, not the role group every maintainer is in; theirs to publish or retire.
    assert new.visibility == "restricted" and list(new.groups.values_list("name", flat=True)) == ["lab"]
    assert access.can_maintain_image(maintainer, new)
    assert not services.visible_images(bob).filter(pk=new.pk).exists()


def test_a_maintainer_with_no_group_of_their_own_captures_as_any_user(sim_host, image, maintainer, bob, sync_jobs):
    maintainer.groups.remove(Group.objects.get(name="lab"))
    job = capture(maintainer, built(maintainer, image, sync_jobs), "nobodys", sync_jobs)
    assert job.status == "success", job.error_message
    new = Image.objects.get(name="nobodys")
    assert new.visibility == "restricted" and not new.groups.exists()
    assert not services.visible_images(bob).filter(pk=new.pk).exists()


def test_capture_refuses_a_taken_name_and_a_strangers_vm(sim_host, image, alice, bob, sync_jobs):
    vm = built(alice, image, sync_jobs)
    with pytest.raises(ValidationError, match="exists already"):
        services.submit_action(vm, "capture", actor=alice, image_name="debian-12")
    with pytest.raises(ValidationError, match="image name"):
        services.submit_action(vm, "capture", actor=alice, image_name="no spaces")
    # Through the generic jobs API too, and before the VM is stopped.
    job = services.jobs.submit("vm.capture", {"vm": vm.pk, "image_name": "debian-12"}, actor=alice)
    sync_jobs.drain()
    job = Job.objects.get(pk=job.pk)
    assert job.status == "error" and "exists already" in job.error_message and job.steps == []
    job = capture(bob, vm, "stolen", sync_jobs)
    assert job.status == "error" and f"VM {vm.pk} does not exist" in job.error_message
    assert not Image.objects.filter(name="stolen").exists()
    assert VM.objects.get(pk=vm.pk).state == "running"


def test_capture_through_the_api_and_the_cli(api, sim_host, image, alice, bob, sync_jobs):
    vm = built(alice, image, sync_jobs)
    url = f"/api/v1/vms/{vm.pk}/capture/"
    assert api(bob).post(url, {"image_name": "x"}, format="json").status_code == 404
    bad = api(alice).post(url, {"image_name": "debian-12"}, format="json")
    assert bad.status_code == 400 and "image_name" in bad.json()["error"]["fields"]
    response = api(alice).post(url, {"image_name": "from-api", "force": True}, format="json")
    assert response.status_code == 202, response.json()
    sync_jobs.drain()
    assert Job.objects.get(pk=response.json()["job"]).status == "success"
    assert Image.objects.get(name="from-api").parent == image
    out = StringIO()
    call_command("vm", "capture", str(vm.pk), "from-cli", stdout=out)
    assert "submitted" in out.getvalue()
    sync_jobs.drain()
    assert Image.objects.get(name="from-cli").parent == image


def test_capture_on_libvirt(kvm_host, kvm_image, admin_user, sync_jobs):  # noqa: F811
    vm = built(admin_user, kvm_image, sync_jobs)
    job = capture(admin_user, vm, "ubuntu-custom", sync_jobs)
    assert job.status == "success", job.error_message
    assert drivers.driver_for(kvm_host).state(vm.key) == "stopped"
    variant = Image.objects.get(name="ubuntu-custom").variants.get()
    assert (variant.hypervisor_type, variant.format) == ("kvm", "qcow2")
    assert variant.location.endswith("ubuntu-custom.qcow2")
    # The derived image boots on the same host.
    assert built(admin_user, variant.image, sync_jobs).state == "running"


def test_a_users_capture_is_theirs_to_reserve_at_once(sim_host, image, alice, bob, sync_jobs):
    from datetime import timedelta

    from reservations import services as reservations

    vm = built(alice, image, sync_jobs)
    job = capture(alice, vm, "alice-template", sync_jobs, comment="lab 3 tools installed")
    assert job.status == "success", job.error_message
    new = Image.objects.get(name="alice-template")
    assert new.owner == alice and new.revisions.get().comment == "lab 3 tools installed"
    assert services.visible_images(alice).filter(pk=new.pk).exists()  # no administrator's publishing
    assert not services.visible_images(bob).filter(pk=new.pk).exists()
    reservation = reservations.reserve(alice, new, actor=alice, duration=timedelta(hours=1))
    sync_jobs.drain()
    reservation.refresh_from_db()
    assert reservation.status == "ready", reservation.error
    assert reservation.vm.image == new and reservation.vm.state == "running"
    with pytest.raises(ValidationError):
        reservations.reserve(bob, new, actor=bob, duration=timedelta(hours=1))


def test_a_capture_into_a_revision_of_an_image_the_submitter_does_not_maintain_is_refused(
    sim_host, image, alice, sync_jobs
):
    vm = built(alice, image, sync_jobs)
    job = capture(alice, vm, "debian-12-r2", sync_jobs, image=image.pk)
    assert job.status == "error" and "is not yours to change" in job.error_message
    assert image.revisions.count() == 1 and VM.objects.get(pk=vm.pk).state == "running"  # refused before the stop


def test_an_administrators_capture_into_an_image_adds_its_next_revision(sim_host, image, admin_user, sync_jobs):
    vm = built(admin_user, image, sync_jobs)
    job = capture(admin_user, vm, "debian-12-r2", sync_jobs, image=image.pk, production=True, comment="patched")
    assert job.status == "success", job.error_message
    assert job.result["revision"] == 2 and not Image.objects.filter(name="debian-12-r2").exists()
    second = image.revisions.get(number=2)
    assert (second.state, second.comment, second.parent.number) == ("production", "patched", 1)
