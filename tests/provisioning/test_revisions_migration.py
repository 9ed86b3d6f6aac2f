"""A database from before image revisions: each image becomes revision 1, in production,
holding all its variants, its VMs built from it, its host cache rows kept; nothing is lost."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from inventory.models import Hypervisor
from provisioning import revisions, services
from provisioning.models import VM, HostImage, Image, ImageRevision

BEFORE = [("vms", "0015_moved_task_paths")]


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def _old_rows(old):
    Image, ImageVariant = old.get_model("vms", "Image"), old.get_model("vms", "ImageVariant")
    host = Hypervisor.objects.create(name="kvm-1", address="kvm-1.example.org", cpus=8, memory_mib=8192, disk_gib=100)
    debian = Image.objects.create(name="debian-12")
    kvm = ImageVariant.objects.create(image=debian, hypervisor_type="kvm", format="qcow2", location="/img/d.qcow2")
    ImageVariant.objects.create(image=debian, hypervisor_type="sim", format="sim", location="sim://library/d")
    Image.objects.create(name="no-variants")
    old.get_model("vms", "HostImage").objects.create(host_id=host.pk, variant=kvm, state="staged", location="/pool/d")
    old.get_model("vms", "VM").objects.create(
        image=debian, variant=kvm, host_id=host.pk, vcpus=1, memory_mib=512, disk_gib=5
    )
    return debian.pk, debian.created


# One test, not two: each migration of the whole graph back or forth costs seconds, and both
# parts start from the same old rows migrated forward.
@pytest.mark.django_db(transaction=True)
def test_each_image_becomes_one_production_revision_and_it_migrates_back_unless_that_would_drop_disks():
    debian_id, created = _old_rows(_migrate(BEFORE))

    _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

    debian = Image.objects.get(pk=debian_id)
    (revision,) = debian.revisions.all()
    assert (revision.number, revision.state, revision.created) == (1, "production", created)
    assert sorted(debian.variants.values_list("hypervisor_type", "revision_id")) == [
        ("kvm", revision.pk),
        ("sim", revision.pk),
    ]
    assert VM.objects.get().revision == revision
    assert HostImage.objects.get().variant.revision == revision
    assert revisions.production(Image.objects.get(name="no-variants")).number == 1

    _migrate(BEFORE)  # one revision per image: the old layout holds it all
    _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
    debian = Image.objects.get(name="debian-12")
    services.add_revision(
        debian, actor="test", variants=[{"hypervisor_type": "sim", "format": "sim", "location": "sim://library/d2"}]
    )

    with pytest.raises(RuntimeError, match="2 sim variants"):
        _migrate(BEFORE)
    _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
    assert ImageRevision.objects.filter(image=debian).count() == 2
