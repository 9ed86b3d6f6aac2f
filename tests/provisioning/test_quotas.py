"""Ad-hoc VMs obey the one quota engine, have an end that is enforced, and never run without a
claim; the engine's limits: image rules, licence caps, vCPU and memory
totals, rules that only tighten (item 10)."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.utils import timezone

from capacity import services as capacity
from capacity.models import Allocation
from core.errors import Conflict
from provisioning import quotas, services
from provisioning.models import VM, QuotaRule
from tests.images import sim_image

H = timedelta(hours=1)


def request(owner, image, **kwargs):
    return services.request_vm(actor=owner, owner=owner, image=image, **kwargs)[0]


def fields(answer):
    return answer.json()["error"]["fields"]


def refusal(caught):
    return " ".join(m for messages in caught.value.message_dict.values() for m in messages)


def test_a_users_adhoc_vm_always_has_an_end(sim_host, image, alice, settings):
    settings.VM_DEFAULT_MINUTES = 90
    vm = request(alice, image)
    assert vm.adhoc and vm.end is not None
    assert abs((vm.end - timezone.now()) - timedelta(minutes=90)) < timedelta(minutes=1)
    with pytest.raises(ValidationError, match=r"at most 8 h for debian-12 \(the site default\)"):
        request(alice, image, end=timezone.now() + 9 * H)
    with pytest.raises(ValidationError, match="the end is in the past"):
        request(alice, image, end=timezone.now() - H)
    QuotaRule.objects.create(name="short", max_duration_minutes=30)
    assert request(alice, image).end - timezone.now() <= timedelta(minutes=30)  # the default never exceeds the max


def test_staff_may_keep_an_open_ended_vm(sim_host, image, admin_user):
    assert request(admin_user, image).end is None


def test_adhoc_vms_count_against_the_same_limit_as_reservations(sim_host, image, alice, bob):
    for _ in range(3):
        request(alice, image)
    with pytest.raises(ValidationError) as caught:
        request(alice, image)
    assert "you already have 3 reservations or VMs at that time; at most 3 (the site default)" in refusal(caught)
    assert VM.objects.filter(owner=alice).count() == 3
    assert request(bob, image).owner == bob  # another user's count is their own


def test_a_vms_end_is_enforced_and_its_claim_counts_until_it_is_gone(make_host, image, alice, sync_jobs):
    make_host("small", cpus=1, memory_mib=1024, disk_gib=20)
    vm = request(alice, image, end=timezone.now() + H)
    sync_jobs.drain()
    vm.refresh_from_db()
    assert vm.state == "running" and vm.allocation.released is None
    VM.objects.filter(pk=vm.pk).update(end=timezone.now() - timedelta(minutes=1))
    Allocation.objects.filter(pk=vm.allocation_id).update(end=timezone.now() - timedelta(minutes=1))
    whole_host = services.demand_for(
        image,
        {"vcpus": 1, "memory_mib": 1024, "disk_gib": 5},
        start=timezone.now(),
        end=timezone.now() + H,
        purpose="probe",
    )
    assert not capacity.plan(whole_host).ok  # over its end, but still on the host: its room is taken
    with pytest.raises(capacity.NoCapacity):
        capacity.claim(whole_host, actor="test")
    with pytest.raises(Conflict, match="time ended"):
        services.submit_action(VM.objects.get(pk=vm.pk), "resume", actor=alice)
    assert services.end_overdue(actor="test") == {"overdue": 1, "submitted": 1}
    assert services.end_overdue(actor="test") == {"overdue": 1, "submitted": 0}  # one destroy at a time
    sync_jobs.drain()
    vm.refresh_from_db()
    assert vm.state == "destroyed" and vm.allocation.released is not None
    assert capacity.plan(whole_host).ok


def test_a_vm_without_a_live_claim_cannot_start(sim_host, image, alice, api, sync_jobs):
    vm = request(alice, image)
    sync_jobs.drain()
    services.submit_action(VM.objects.get(pk=vm.pk), "stop", actor=alice)
    sync_jobs.drain()
    vm = VM.objects.get(pk=vm.pk)
    capacity.release(vm.allocation, actor="test", reason="its reservation ended")
    answer = api(alice).post(f"/api/v1/vms/{vm.pk}/start/")
    assert answer.status_code == 409, answer.content
    assert "holds no claim on a host" in answer.json()["error"]["message"]
    for action in ("start", "resume", "revert"):
        with pytest.raises(Conflict, match="cannot run"):
            services.submit_action(VM.objects.get(pk=vm.pk), action, actor=alice, name="clean")
    assert services.run_refusal(vm, "stop") is None  # stopping, destroying: always


def test_a_start_job_queued_before_the_claim_went_is_refused_when_it_runs(sim_host, image, alice, sync_jobs):
    from jobs.models import Job

    vm = request(alice, image)
    sync_jobs.drain()
    services.submit_action(VM.objects.get(pk=vm.pk), "stop", actor=alice)
    sync_jobs.drain()
    job = services.submit_action(VM.objects.get(pk=vm.pk), "start", actor=alice)
    capacity.release(VM.objects.get(pk=vm.pk).allocation, actor="test")
    sync_jobs.drain()
    assert Job.objects.get(pk=job.pk).status == "error"
    assert VM.objects.get(pk=vm.pk).state == "stopped"


def test_an_image_rule_counts_only_that_images_holdings(sim_host, image, alice):
    other = sim_image(
        "windows-11",
        location="sim://w11",
        size_gib=1,
        os="Windows 11",
        min_memory_mib=256,
        default_memory_mib=512,
        default_disk_gib=5,
    )
    QuotaRule.objects.create(name="one windows", image=other, max_per_user=1)
    request(alice, image)
    request(alice, image)
    request(alice, other)  # the debian VMs are not windows-11's
    with pytest.raises(ValidationError) as caught:
        request(alice, other)
    assert "you already have 1 reservation or VM of windows-11 at that time; at most 1 (rule 'one windows')" in (
        refusal(caught)
    )


def test_an_images_licence_cap_counts_every_users(sim_host, image, alice, bob):
    services.update_image(image, actor="test", max_concurrent=2)
    request(alice, image)
    request(bob, image)
    with pytest.raises(ValidationError) as caught:
        request(alice, image)
    assert "debian-12 may run at most 2 at once (its licence cap); 2 reservations or VMs already overlap" in (
        refusal(caught)
    )


def test_group_vcpu_and_memory_totals(sim_host, image, alice, bob):
    students = Group.objects.create(name="students")
    alice.groups.add(students)
    bob.groups.add(students)
    QuotaRule.objects.create(name="lab", group=students, max_vcpus=4, max_memory_mib=3072)
    request(alice, image, vcpus=2, memory_mib=1024)
    with pytest.raises(ValidationError) as caught:
        request(bob, image, vcpus=3, memory_mib=1024)
    assert "group students already holds 2 vCPUs at that time; 3 more would make 5, at most 4 (rule 'lab')" in (
        refusal(caught)
    )
    request(bob, image, vcpus=2, memory_mib=1024)
    with pytest.raises(ValidationError, match=r"holds 2048 MiB of memory at that time; .* at most 3072 \(rule 'lab'\)"):
        quotas.check_locked(bob, image, timezone.now(), timezone.now() + H, {"vcpus": 0, "memory_mib": 2048})


def test_a_rule_never_raises_a_site_default(sim_host, image, alice):
    QuotaRule.objects.create(name="generous", max_per_user=10, max_duration_minutes=10_000)  # an old row, unchecked
    limits = quotas.limits_for(alice, image)
    assert (limits.max_minutes, limits.max_minutes_rule) == (480, "the site default")
    assert [(limit.value, limit.rule) for limit in limits.concurrent] == [(3, "the site default")]


def test_a_rule_above_a_site_default_or_a_group_total_without_group_is_refused_at_save(db, admin_user, api):
    client = api(admin_user)
    answer = client.post("/api/v1/quota-rules/", {"name": "generous", "max_per_user": 5}, format="json")
    assert answer.status_code == 400
    assert "at most the site default 3 (RESERVATION_MAX_PER_USER)" in fields(answer)["max_per_user"][0]
    answer = client.post("/api/v1/quota-rules/", {"name": "all", "max_vcpus": 64}, format="json")
    assert answer.status_code == 400 and "needs a group" in fields(answer)["max_vcpus"][0]
    rule = client.post("/api/v1/quota-rules/", {"name": "tight", "max_per_user": 2}, format="json").json()
    answer = client.patch(f"/api/v1/quota-rules/{rule['id']}/", {"max_duration_minutes": 481}, format="json")
    assert answer.status_code == 400 and "RESERVATION_MAX_MINUTES" in fields(answer)["max_duration_minutes"][0]
    assert not QuotaRule.objects.filter(name__in=["generous", "all"]).exists()


def test_the_admin_form_refuses_a_rule_above_the_default(db, admin_user, client):
    client.force_login(admin_user)
    page = client.post("/admin/vms/quotarule/add/", {"name": "generous", "max_duration_minutes": 600})
    assert page.status_code == 200 and "a rule can only tighten it" in page.content.decode()
    assert not QuotaRule.objects.exists()


@pytest.fixture
def fast_clock_worker(transactional_db, tmp_path):
    from tests import processes

    child = processes.start_worker(tmp_path, RESERVATION_TICK_SECONDS=5)
    yield child
    child.stop()


@pytest.mark.slow
def test_a_workers_vm_clock_destroys_an_overdue_vm(fast_clock_worker, make_host, image, alice):
    from tests.jobs.helpers import wait_until

    make_host("sim-clock")
    vm = request(alice, image)
    wait_until(lambda: VM.objects.get(pk=vm.pk).state == "running", 60, "the VM to be built", fast_clock_worker)
    VM.objects.filter(pk=vm.pk).update(end=timezone.now() - timedelta(seconds=1))
    wait_until(lambda: VM.objects.get(pk=vm.pk).state == "destroyed", 60, "the clock to end it", fast_clock_worker)
    assert VM.objects.get(pk=vm.pk).allocation.released is not None
