"""Image revisions on vcsim (driver vmware): a VM made after make-production is cloned from the
new revision's template, VMs already built keep theirs, a roll-back builds from the old disk
again, and deleting the old revision removes its staged disk from the datastore."""

import pytest
from pyVmomi import vim

from core.errors import InUse
from drivers import registry as drivers
from provisioning import revisions, services
from provisioning.models import VM
from tests.provisioning.test_vmware import act, esx_host, run, vmdk_image  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow
MARK = "ubuntu64Guest"  # the guest id given to revision 2's template only: a clone inherits it


def build(image, owner, sync_jobs):
    vm, job = services.request_vm(actor=owner, owner=owner, image=image)
    run(job, sync_jobs)
    return VM.objects.select_related("variant", "revision").get(pk=vm.pk)


def guest_id(driver, vm):
    return driver._props(driver._vm(vm.key), ["config.guestId"])["config.guestId"]


def template_from(driver, vm, name):
    """A template of the stopped ``vm`` marked with ``MARK`` (the next revision's disk)."""
    spec = vim.vm.ConfigSpec(guestId=MARK)
    driver._wait(driver._call("mark", driver._vm(vm.key).ReconfigVM_Task, spec=spec), "mark")
    return driver.capture(vm.key, name)


def test_new_vms_clone_the_production_revisions_template(esx_host, vmdk_image, admin_user, sync_jobs, tmp_path):  # noqa: F811
    driver = drivers.driver_for(esx_host)
    first = revisions.production(vmdk_image)
    try:
        old = build(vmdk_image, admin_user, sync_jobs)
        assert (old.revision, old.variant.format) == (first, "vmdk") and guest_id(driver, old) != MARK
        staged = services.cached(esx_host, old.variant).location
        act(old, "stop", sync_jobs, force=True)
        template = template_from(driver, old, f"rev2-{tmp_path.name}"[:100])
        second = services.add_revision(
            vmdk_image,
            actor=admin_user,
            comment="patched",
            variants=[{"hypervisor_type": "vmware", "format": "template", "location": template.location}],
        )
        revisions.make_production(second, actor=admin_user)

        new = build(vmdk_image, admin_user, sync_jobs)

        assert (new.revision, new.variant.format, new.variant.location) == (second, "template", template.location)
        assert driver.state(new.key) == "running" and guest_id(driver, new) == MARK
        assert VM.objects.get(pk=old.pk).revision == first  # built VMs keep theirs

        revisions.make_production(first, actor=admin_user)  # the roll-back
        rolled_back = build(vmdk_image, admin_user, sync_jobs)
        assert rolled_back.revision == first and guest_id(driver, rolled_back) != MARK
        act(rolled_back, "destroy", sync_jobs)

        revisions.make_production(second, actor=admin_user)
        with pytest.raises(InUse):
            revisions.delete_revision(first, actor=admin_user)
        act(old, "destroy", sync_jobs)
        revisions.retire(first, actor=admin_user)
        (unstage,) = revisions.delete_revision(first, actor=admin_user)
        run(unstage, sync_jobs)
        ds_name, relative = staged[1:].split("] ", 1)
        datastore = next(ds for ds in driver._host().datastore if ds.name == ds_name)
        assert not driver._exists(datastore, relative)  # the staged base disk is gone
        assert driver._find(template.location) is not None  # the library's template is not vclmgr's to delete
    finally:
        for made in VM.objects.all():
            driver.destroy(made.key)
