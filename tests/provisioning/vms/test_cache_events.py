"""The image cache's transfer throttle, and the events a VM emits."""

from datetime import timedelta

from django.utils import timezone

from provisioning.vms import opcodes, services
from provisioning.vms.models import HostImage
from vclmgr import topics
from vclmgr.models import Event


def variants(image, n):
    out = []
    for i in range(n):
        other = services.create_image("test", name=f"img-{i}", min_memory_mib=256, default_memory_mib=512)
        out.append(services.add_variant("test", other, hypervisor_type="sim", format="sim", location=f"sim://l/{i}"))
    return out


def test_at_most_n_transfers_run_per_host(sim_host, image, monkeypatch):
    monkeypatch.setattr(opcodes, "STAGE_PER_HOST", 2)
    a, b, c = variants(image, 3)
    assert opcodes._take_stage_slot(sim_host, a, 1) == "mine"
    assert opcodes._take_stage_slot(sim_host, b, 2) == "mine"
    assert opcodes._take_stage_slot(sim_host, c, 3) is None  # both slots busy
    assert opcodes._take_stage_slot(sim_host, a, 4) is None  # being copied by job 1: wait for it
    assert opcodes._take_stage_slot(sim_host, a, 1) == "mine"  # job 1 retried keeps its slot
    HostImage.objects.filter(variant=a).update(state="staged", staging_job=None)
    assert opcodes._take_stage_slot(sim_host, a, 4) == "staged"
    assert opcodes._take_stage_slot(sim_host, c, 3) == "mine"


def test_a_dead_workers_slot_is_taken_over(sim_host, image, monkeypatch):
    monkeypatch.setattr(opcodes, "STAGE_PER_HOST", 1)
    a, b = variants(image, 2)
    assert opcodes._take_stage_slot(sim_host, a, 1) == "mine"
    assert opcodes._take_stage_slot(sim_host, b, 2) is None
    old = timezone.now() - timedelta(seconds=opcodes.STAGE_STALE_SECONDS + 1)
    HostImage.objects.filter(variant=a).update(started=old)
    assert opcodes._take_stage_slot(sim_host, b, 2) == "mine"
    assert opcodes._take_stage_slot(sim_host, a, 3) is None  # the slot limit holds for the takeover too


def test_state_changes_reach_the_owner_and_admin(sim_host, image, alice, bob, admin_user, sync_jobs):
    vm, _ = services.request_vm(alice, owner=alice, image=image)
    sync_jobs.drain()
    states = list(Event.objects.filter(topic=f"vm.{vm.pk}", kind="vm.changed").values_list("data__state", flat=True))
    assert states == ["requested", "staging", "defining", "starting", "running"]
    assert Event.objects.filter(topic=topics.user_topic(alice), kind="vm.changed").count() == 5
    assert topics.may_subscribe(alice, f"vm.{vm.pk}") and topics.may_subscribe(admin_user, f"vm.{vm.pk}")
    assert not topics.may_subscribe(bob, f"vm.{vm.pk}")
