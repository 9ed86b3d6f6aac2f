"""The image cache's transfer throttle, and the events a VM emits."""

from datetime import timedelta

from django.utils import timezone

from core import topics
from core.models import Event
from provisioning import services
from provisioning.models import HostImage
from provisioning.opcodes import staging


def variants(image, n):
    out = []
    for i in range(n):
        other = services.create_image(actor="test", name=f"img-{i}", min_memory_mib=256, default_memory_mib=512)
        out.append(
            services.add_variant(other, actor="test", hypervisor_type="sim", format="sim", location=f"sim://l/{i}")
        )
    return out


def test_at_most_n_transfers_run_per_host(sim_host, image, settings):
    settings.VCLMGR_STAGE_PER_HOST = 2
    a, b, c = variants(image, 3)
    assert staging._take_stage_slot(sim_host, a, 1) == "mine"
    assert staging._take_stage_slot(sim_host, b, 2) == "mine"
    assert staging._take_stage_slot(sim_host, c, 3) is None  # both slots busy
    assert staging._take_stage_slot(sim_host, a, 4) is None  # being copied by job 1: wait for it
    assert staging._take_stage_slot(sim_host, a, 1) == "mine"  # job 1 retried keeps its slot
    HostImage.objects.filter(variant=a).update(state="staged", staging_job=None)
    assert staging._take_stage_slot(sim_host, a, 4) == "staged"
    assert staging._take_stage_slot(sim_host, c, 3) == "mine"


def test_a_dead_workers_slot_is_taken_over(sim_host, image, settings):
    settings.VCLMGR_STAGE_PER_HOST = 1
    a, b = variants(image, 2)
    assert staging._take_stage_slot(sim_host, a, 1) == "mine"
    assert staging._take_stage_slot(sim_host, b, 2) is None
    old = timezone.now() - timedelta(seconds=staging.STAGE_STALE_SECONDS + 1)
    HostImage.objects.filter(variant=a).update(started=old)
    assert staging._take_stage_slot(sim_host, b, 2) == "mine"
    assert staging._take_stage_slot(sim_host, a, 3) is None  # the slot limit holds for the takeover too


def test_state_changes_reach_the_owner_and_admin(sim_host, image, alice, bob, admin_user, sync_jobs):
    vm, _ = services.request_vm(actor=alice, owner=alice, image=image)
    sync_jobs.drain()
    changes = Event.objects.filter(topic=f"vm.{vm.pk}", kind="vm.changed").order_by("id")
    states = list(changes.values_list("data__state", flat=True))
    assert states == ["requested", "staging", "defining", "starting", "running"]
    assert Event.objects.filter(topic=topics.user_topic(alice), kind="vm.changed").count() == 5
    assert topics.may_subscribe(alice, f"vm.{vm.pk}") and topics.may_subscribe(admin_user, f"vm.{vm.pk}")
    assert not topics.may_subscribe(bob, f"vm.{vm.pk}")


def test_transfers_are_limited_per_chassis_and_in_all(make_host, chassis, image, settings):
    settings.VCLMGR_STAGE_PER_HOST = 5
    settings.VCLMGR_STAGE_PER_CHASSIS = 2
    settings.VCLMGR_STAGE_GLOBAL = 3
    blades = [make_host(f"blade-{n}", blade_center=chassis, slot=n) for n in (1, 2, 3)]
    loose = [make_host(f"loose-{n}") for n in (1, 2)]
    a, b, c = variants(image, 3)
    assert staging._take_stage_slot(blades[0], a, 1) == "mine"
    assert staging._take_stage_slot(blades[1], a, 2) == "mine"
    assert staging._take_stage_slot(blades[2], a, 3) is None  # the chassis has 2 transfers running
    assert staging._take_stage_slot(loose[0], a, 4) == "mine"  # outside the chassis: the global limit allows a 3rd
    assert staging._take_stage_slot(loose[1], b, 5) is None  # 3 running in all
    HostImage.objects.filter(staging_job=1).update(state="staged", staging_job=None)
    assert staging._take_stage_slot(blades[2], c, 6) == "mine"


def test_prestage_copies_an_image_onto_a_groups_hosts(make_host, group, image, admin_user, sync_jobs):
    import pytest
    from django.core.exceptions import ValidationError
    from django_q.models import Schedule

    from jobs.models import Job

    hosts = [make_host(f"lab-{n}", group=group) for n in (1, 2, 3)]
    make_host("elsewhere")
    job = services.prestage(image, group, actor=admin_user)
    sync_jobs.drain()
    job = Job.objects.get(pk=job.pk)
    assert job.status == "success", job.error_message
    assert sorted(job.result["result"]["hosts"]) == [h.pk for h in hosts]
    staged = set(HostImage.objects.filter(state="staged").values_list("host__name", flat=True))
    assert staged == {"lab-1", "lab-2", "lab-3"}
    again = services.prestage(image, group, actor=admin_user)
    sync_jobs.drain()
    assert Job.objects.get(pk=again.pk).result["hosts"] == []  # nothing left to copy (no children)
    later = timezone.now() + timedelta(hours=2)
    schedule = services.prestage(image, group, actor=admin_user, at=later)
    assert schedule.func == "provisioning.tasks.submit_prestage" and schedule.next_run == later
    assert Schedule.objects.filter(pk=schedule.pk).exists()
    with pytest.raises(ValidationError, match="in the past"):
        services.prestage(image, group, actor=admin_user, at=timezone.now() - timedelta(hours=1))


def test_prestage_through_the_api(make_host, group, image, admin_user, alice, api):
    make_host("lab-1", group=group)
    url = f"/api/v1/images/{image.pk}/prestage/"
    assert api(alice).post(url, {"group": group.pk}, format="json").status_code == 403
    response = api(admin_user).post(url, {"group": group.pk}, format="json")
    assert response.status_code == 202 and response.json()["job"]
    later = (timezone.now() + timedelta(hours=1)).isoformat()
    response = api(admin_user).post(url, {"group": group.pk, "at": later}, format="json")
    assert response.status_code == 201 and response.json()["schedule"]
