"""Image revisions: the one production revision, roll-back, what new and existing VMs are
built from, and what deleting a revision refuses and removes (simulator, jobs in-process)."""

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from core.errors import Conflict, InUse
from core.models import ObjectChange
from drivers.sim.models import SimImage
from jobs.models import Job
from provisioning import revisions, services
from provisioning.models import VM, HostImage, ImageRevision

SIM = {"hypervisor_type": "sim", "format": "sim", "size_gib": 2}


def second_revision(image, actor="test", name="v2"):
    return services.add_revision(
        image, actor=actor, comment="security updates", variants=[{**SIM, "location": f"sim://library/{name}"}]
    )


def changes_of(revision):
    """The revision's change log, newest first."""
    return list(ObjectChange.objects.filter(content_type__model="imagerevision", object_id=str(revision.pk)))


def build(owner, image, sync_jobs):
    vm, job = services.request_vm(actor=owner, owner=owner, image=image)
    sync_jobs.drain()
    assert Job.objects.get(pk=job.pk).status == "success", Job.objects.get(pk=job.pk).error_message
    return VM.objects.select_related("variant").get(pk=vm.pk)


def destroy(vm, sync_jobs):
    services.submit_action(vm, "destroy", actor="test")
    sync_jobs.drain()
    assert VM.objects.get(pk=vm.pk).state == "destroyed"


def test_a_new_image_gets_revision_one_in_production(image):
    (revision,) = image.revisions.all()
    assert (revision.number, revision.state) == (1, "production")
    assert [v.revision_id for v in image.variants.all()] == [revision.pk]


def test_an_image_has_at_most_one_production_revision(image):
    second = second_revision(image)
    second.state = "production"
    with pytest.raises(IntegrityError), transaction.atomic():
        second.save()


def test_revision_numbers_are_unique_per_image(image):
    with pytest.raises(IntegrityError), transaction.atomic():
        ImageRevision.objects.create(image=image, number=1)


def test_a_revision_has_one_variant_per_hypervisor_type(image):
    with pytest.raises(ValidationError, match="already has a sim variant"):
        services.add_variant(image, actor="test", **SIM, location="sim://library/again")


def test_it_adds_a_testing_revision_made_from_production(image, alice):
    second = second_revision(image, actor=alice)
    assert (second.number, second.state, second.comment) == (2, "testing", "security updates")
    assert second.parent == revisions.production(image) and second.created_by == alice
    assert [c.action for c in changes_of(second)] == ["create"]


def test_a_revision_needs_a_disk(image):
    with pytest.raises(ValidationError, match="at least one variant"):
        services.add_revision(image, actor="test", variants=[])


def test_a_bad_variant_adds_no_revision(image):
    with pytest.raises(ValidationError):
        services.add_revision(image, actor="test", variants=[{**SIM, "location": ""}])
    assert image.revisions.count() == 1


def test_new_vms_use_production_and_running_ones_keep_theirs(sim_host, image, alice, sync_jobs):
    first = build(alice, image, sync_jobs)
    assert first.revision.number == 1
    second = second_revision(image)
    assert build(alice, image, sync_jobs).revision.number == 1  # testing is not offered

    revisions.make_production(second, actor="test")

    newer = build(alice, image, sync_jobs)
    assert newer.revision == second and newer.variant.location == "sim://library/v2"
    assert SimImage.objects.filter(host__name=sim_host.name, location="sim://library/v2").exists()
    first.refresh_from_db()
    assert first.revision.number == 1 and first.state == "running"
    assert VM.objects.get(pk=first.pk).variant.location == "sim://library/debian-12"


def test_roll_back_makes_an_older_revision_production_again(image):
    first, second = revisions.production(image), second_revision(image)
    revisions.make_production(second, actor="test")
    assert ImageRevision.objects.get(pk=first.pk).state == "testing"

    revisions.make_production(ImageRevision.objects.get(pk=first.pk), actor="test")

    assert revisions.production(image) == first
    assert ImageRevision.objects.get(pk=second.pk).state == "testing"
    assert [c.changes["state"] for c in changes_of(first) if c.action == "update"] == [
        ["testing", "production"],
        ["production", "testing"],
    ]


def test_a_rebuild_keeps_the_vms_revision(sim_host, image, alice, sync_jobs):
    from provisioning.opcodes.common import variant_for

    vm = build(alice, image, sync_jobs)
    revisions.make_production(second_revision(image), actor="test")
    VM.objects.filter(pk=vm.pk).update(variant=None)  # what a rebuild elsewhere starts from
    assert variant_for(VM.objects.get(pk=vm.pk), sim_host).location == "sim://library/debian-12"


def test_it_refuses_to_retire_or_delete_production(image):
    production = revisions.production(image)
    with pytest.raises(Conflict, match="make another one production first"):
        revisions.retire(production, actor="test")
    with pytest.raises(Conflict, match="make another one production first"):
        revisions.delete_revision(production, actor="test")


def test_it_refuses_to_delete_a_revision_in_use(sim_host, image, alice, sync_jobs):
    vm = build(alice, image, sync_jobs)
    old = revisions.production(image)
    revisions.make_production(second_revision(image), actor="test")
    revisions.retire(old, actor="test")

    with pytest.raises(InUse, match="in use by 1 VMs"):
        revisions.delete_revision(old, actor="test")
    assert ImageRevision.objects.filter(pk=old.pk).exists()

    destroy(vm, sync_jobs)
    revisions.delete_revision(old, actor="test")
    assert not ImageRevision.objects.filter(pk=old.pk).exists()
    assert VM.objects.get(pk=vm.pk).revision is None  # a destroyed VM holds nothing


def test_deleting_an_unused_retired_revision_removes_its_copies_from_hosts(sim_host, image, alice, sync_jobs):
    destroy(build(alice, image, sync_jobs), sync_jobs)
    old = revisions.production(image)
    cached = HostImage.objects.get(variant__revision=old)
    assert SimImage.objects.filter(host__name=sim_host.name).count() == 1
    revisions.make_production(second_revision(image), actor="test")
    revisions.retire(old, actor="test")

    old_id = old.pk
    (job,) = revisions.delete_revision(old, actor="test", reason="old disk")
    sync_jobs.drain()

    assert Job.objects.get(pk=job.pk).status == "success"
    assert Job.objects.get(pk=job.pk).result == {"removed": True}
    assert not HostImage.objects.filter(pk=cached.pk).exists()
    assert not SimImage.objects.filter(host__name=sim_host.name).exists()
    deleted = ObjectChange.objects.filter(content_type__model="imagerevision", object_id=str(old_id)).first()
    assert (deleted.action, deleted.reason) == ("delete", "old disk")


def test_a_copy_another_revision_shares_stays(sim_host, image, alice, sync_jobs):
    destroy(build(alice, image, sync_jobs), sync_jobs)
    old = revisions.production(image)
    same = second_revision(image, name="debian-12")  # the same disk again
    revisions.make_production(same, actor="test")
    destroy(build(alice, image, sync_jobs), sync_jobs)

    assert revisions.delete_revision(old, actor="test") == []
    assert SimImage.objects.filter(host__name=sim_host.name).count() == 1


def test_parked_vms_of_an_old_revision_are_not_handed_on(sim_host, image, alice, sync_jobs):
    vm = build(alice, image, sync_jobs)
    services.submit_action(vm, "stop", actor="test")
    sync_jobs.drain()
    VM.objects.filter(pk=vm.pk).update(allocation=None)  # its claim given back: waiting for a next user
    assert list(services.parked(image)) == [VM.objects.get(pk=vm.pk)]
    revisions.make_production(second_revision(image), actor="test")
    assert list(services.parked(image)) == []


def test_a_vm_requested_with_a_revisions_variant_holds_it(image, alice):
    old = revisions.production(image)
    # As a reservation does: the variant is picked with the claim, the revision written when built.
    services.request_vm(actor=alice, owner=alice, image=image, variant=old.variants.get().pk)
    revisions.make_production(second_revision(image), actor="test")
    with pytest.raises(InUse, match="in use by 1 VMs"):
        revisions.delete_revision(old, actor="test")
