"""An image's template loop on real QEMU: its maintainer starts the template, writes to its disk,
publishes it straight to production; a student's new reservation finds what was written; a roll
back to the first revision gives the next student the old disk while the first student's VM,
running, keeps the published one. Prints the publish time (template → production revision)
beside a raw ``qemu-img convert`` of the same disk in the same run."""

import subprocess
import time

import pytest

from provisioning.models import ImageRevision
from reservations.models import Reservation
from tests.integration import test_real_vm_ops as ops
from tests.integration.test_reserve_real_vm import reserve, wait_ready

pytestmark = pytest.mark.slow
kvm_host, guest, vm_ids, leave_nothing = ops.kvm_host, ops.guest, ops.vm_ids, ops.leave_nothing


def test_publish_then_roll_back_on_real_guests(
    worker, api, admin_user, alice, bob, kvm_host, guest, libvirt_conn, leave_nothing, tmp_path
):
    maintainer = api(admin_user)
    started = maintainer.post(f"/api/v1/images/{guest.pk}/template/", {}, format="json")
    assert started.status_code == 202, started.content
    template = started.json()["reservation"]["id"]
    details = wait_ready(maintainer, template, worker)["connection"]
    ops.write_mark(details, "published-r2", password=details["password"])

    began = time.monotonic()
    published = maintainer.post(
        f"/api/v1/images/{guest.pk}/template/publish/", {"production": True, "comment": "r2"}, format="json"
    )
    assert published.status_code == 202, published.content
    ops.run_job(published.json()["job"], worker)
    publish_seconds = time.monotonic() - began
    first, second = ImageRevision.objects.filter(image=guest).order_by("number")
    assert (first.state, second.state, second.comment) == ("testing", "production", "r2")

    student = api(alice)
    theirs = reserve(student, guest)
    seen = wait_ready(student, theirs, worker)["connection"]
    assert ops.read_mark(seen, password=seen["password"]) == "published-r2"
    assert Reservation.objects.get(pk=theirs).vm.revision_id == second.pk

    assert maintainer.post(f"/api/v1/image-revisions/{first.pk}/make-production/").status_code == 200
    next_student = api(bob)
    later = reserve(next_student, guest)
    fresh = wait_ready(next_student, later, worker)["connection"]
    assert ops.read_mark(fresh, password=fresh["password"]) != "published-r2"
    assert Reservation.objects.get(pk=later).vm.revision_id == first.pk
    assert ops.read_mark(seen, password=seen["password"]) == "published-r2"  # running: untouched

    disk = second.variants.get().location
    began = time.monotonic()
    subprocess.run(["qemu-img", "convert", "-O", "qcow2", disk, str(tmp_path / "raw.qcow2")], check=True, timeout=300)
    print(
        f"publish (template → production revision): {publish_seconds:.2f} s; "
        f"qemu-img convert of the same disk: {time.monotonic() - began:.2f} s"
    )
