"""Pre-staging for classes: a revision made production is copied ahead, through the throttled
``image.stage``, onto the hosts of the block seats starting within the look-ahead, and nowhere
else (simulator, jobs in-process)."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from inventory.models import Hypervisor
from jobs.models import Job
from provisioning import revisions
from provisioning import services as vms
from provisioning.models import HostImage
from provisioning.opcodes import staging
from reservations import services, tasks
from reservations.models import Reservation

H = timedelta(hours=1)


@pytest.fixture
def lab(make_host, image, admin_user):
    """Hosts A and B, each with room for one seat, holding the two seats of a class starting in 20
    hours; host C, made after, holds none."""
    a, b = (make_host(name, cpus=4, memory_mib=3072, disk_gib=50) for name in ("A", "B"))
    start = timezone.now() + 20 * H
    block = services.create_block(
        actor=admin_user,
        name="CS101 lab",
        image=image,
        group=Group.objects.create(name="cs101"),
        seats=2,
        start=start,
        end=start + 2 * H,
    )
    c = make_host("C", cpus=16, memory_mib=65536, disk_gib=500)
    seats = Reservation.objects.filter(block=block)
    assert set(seats.values_list("allocation__host__name", flat=True)) == {"A", "B"}
    return a, b, c, block


def new_production(image, django_capture_on_commit_callbacks, name="v2"):
    revision = vms.add_revision(
        image, actor="test", variants=[{"hypervisor_type": "sim", "format": "sim", "location": f"sim://library/{name}"}]
    )
    with django_capture_on_commit_callbacks(execute=True):
        revisions.make_production(revision, actor="test")
    return revision


def stage_jobs():
    return Job.objects.filter(opcode="image.stage")


def test_a_revision_made_production_is_staged_where_its_class_runs(
    lab, image, sync_jobs, django_capture_on_commit_callbacks
):
    a, b, c, _ = lab
    revision = new_production(image, django_capture_on_commit_callbacks)
    assert sorted(stage_jobs().values_list("params__hypervisor", flat=True)) == [a.pk, b.pk]
    sync_jobs.drain()
    assert set(stage_jobs().values_list("status", flat=True)) == {"success"}
    staged = HostImage.objects.filter(variant__revision=revision, state="staged")
    assert set(staged.values_list("host__name", flat=True)) == {"A", "B"}
    assert tasks.prestage_round() == []  # staged already: the periodic pass asks for nothing
    assert stage_jobs().count() == 2


def test_a_queued_or_running_copy_is_not_asked_for_twice(lab, image, django_capture_on_commit_callbacks):
    new_production(image, django_capture_on_commit_callbacks)
    assert stage_jobs().count() == 2
    assert tasks.prestage_round() == []  # both still queued
    stage_jobs().update(status="running")
    assert tasks.prestage_round() == []


def test_a_class_beyond_the_look_ahead_is_staged_once_it_comes_within(
    lab, image, settings, sync_jobs, django_capture_on_commit_callbacks
):
    settings.VCLMGR_PRESTAGE_LOOKAHEAD_HOURS = 12
    a, b, _, block = lab
    new_production(image, django_capture_on_commit_callbacks)
    assert not stage_jobs().exists()
    assert tasks.prestage_round() == []
    made = tasks.prestage_round(now=block.start - 11 * H)
    assert sorted(Job.objects.filter(pk__in=made).values_list("params__hypervisor", flat=True)) == [a.pk, b.pk]


def test_a_host_not_online_is_skipped(lab, image, django_capture_on_commit_callbacks):
    a, b, _, _ = lab
    # Straight to the row: draining through inventory's service would move the seat's claim away.
    Hypervisor.objects.filter(pk=b.pk).update(state=Hypervisor.State.DRAINED)
    new_production(image, django_capture_on_commit_callbacks)
    assert list(stage_jobs().values_list("params__hypervisor", flat=True)) == [a.pk]


def test_a_canceled_class_is_not_staged(lab, image, django_capture_on_commit_callbacks):
    *_, block = lab
    type(block).objects.filter(pk=block.pk).update(canceled=True)
    new_production(image, django_capture_on_commit_callbacks)
    assert not stage_jobs().exists()


def test_the_copies_wait_for_a_transfer_slot(
    lab, image, settings, monkeypatch, sync_jobs, django_capture_on_commit_callbacks
):
    settings.VCLMGR_STAGE_GLOBAL = 1
    monkeypatch.setattr(staging, "STAGE_WAIT_SECONDS", 0)
    monkeypatch.setattr(staging, "POLL_SECONDS", 0)
    _, _, c, _ = lab
    other = revisions.production(image).variants.get()
    assert staging._take_stage_slot(c, other, 999) == "mine"  # the one transfer allowed in all
    revision = new_production(image, django_capture_on_commit_callbacks)
    sync_jobs.drain()
    assert not HostImage.objects.filter(variant__revision=revision, state__in=("staged", "staging")).exists()
    assert all("no image transfer slot" in job.error_message for job in stage_jobs())
    HostImage.objects.filter(staging_job=999).update(state="staged", staging_job=None)
    assert len(tasks.prestage_round()) == 2  # the periodic pass asks again once they failed
    sync_jobs.drain()
    assert HostImage.objects.filter(variant__revision=revision, state="staged").count() == 2
