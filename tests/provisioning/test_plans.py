"""Plans: computed as dry runs, stored, executed as vm.migrate jobs (sim driver, zero delay)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from capacity.models import Allocation
from capacity.snapshot import snapshot
from core.errors import Conflict
from inventory import services as inventory
from inventory.models import Hypervisor, NodeGroup
from jobs.models import Job
from provisioning import plans, services
from provisioning.models import VM, Plan
from tests.jobs.helpers import wait_until
from tests.provisioning.plan_helpers import build_cluster, future_claim, max_running_at_once, overcommits, wait_plan


def test_a_balance_plan_is_a_dry_run_then_runs_as_jobs(make_host, image, admin_user, sync_jobs):
    hosts, made = build_cluster(make_host, image, admin_user, sync_jobs)
    before = {v.pk: v.host_id for v in VM.objects.all()}
    plan = plans.compute("balance", actor=admin_user)
    assert plan.moves and plan.score_after < plan.score_before
    assert {v.pk: v.host_id for v in VM.objects.all()} == before  # a dry run
    assert not Job.objects.filter(opcode="vm.migrate").exists()
    plan = plans.execute(plan, actor=admin_user)
    migrations = Job.objects.filter(opcode="vm.migrate")
    assert migrations.count() == len(plan.moves)
    assert {tuple(j.buckets[0]) for j in migrations} == {(f"rate-limit:4:plan-{plan.pk}", 4)}
    sync_jobs.drain()
    plan = plans.refresh(Plan.objects.get(pk=plan.pk))
    assert plan.state == "done", plan.moves
    assert plans.live_score(plan.options["score_group"]) == pytest.approx(plan.score_after, abs=1e-9)


@pytest.mark.slow
def test_an_hbal_plan_runs_on_a_live_30_host_cluster_through_real_workers(
    make_host, image, admin_user, built, start_workers
):
    hosts, made = built(make_host, image, admin_user, full=10, empty=20, vms=60, memory_mib=16384)
    reserved = future_claim(hosts[12], memory_mib=12288)  # an empty host that will receive VMs
    plan = plans.compute("balance", actor=admin_user)
    assert len(plan.moves) > 10 and plan.score_after < plan.score_before
    assert any(c["allocation"] == reserved.pk for c in plan.claims)
    child = start_workers(4)
    plans.execute(plan, actor=admin_user)
    plan = wait_plan(plan, child)
    assert plan.state == "done", [m for m in plan.moves if m["status"] != "success"]
    assert plans.live_score(plan.options["score_group"]) == pytest.approx(plan.score_after, abs=1e-9)
    reserved.refresh_from_db()
    assert reserved.released is None and reserved.host_id == hosts[12].pk  # never broken, never moved
    for host in Hypervisor.objects.all():
        assert overcommits(host) == [], host.name
    assert {v.host_id for v in VM.objects.filter(pk__in=[v.pk for v in made])} != {h.pk for h in hosts[:10]}


@pytest.mark.slow
def test_evacuations_with_rate_limit_2_never_run_more_than_2_migrations(
    make_host, image, admin_user, built, start_workers
):
    slow = {"driver_options": {"delay": {"migrate": 0.3}}}
    NodeGroup.objects.create(name="rack-a")
    NodeGroup.objects.create(name="rack-b")
    rack_a = NodeGroup.objects.get(name="rack-a")
    rack_b = NodeGroup.objects.get(name="rack-b")
    hosts, made = built(make_host, image, admin_user, full=1, empty=3, vms=8, group=rack_a, **slow)
    for i in range(3):
        make_host(f"b{i:02d}", group=rack_b, cpus=16, memory_mib=32768, disk_gib=500, **slow)
    snapshot.expire()
    child = start_workers(4)
    node_plan = plans.compute("evacuate-node", actor=admin_user, target="h00", reason="rate-limit:2:maintenance")
    assert len(node_plan.moves) == 8 and node_plan.rate_limit == 2
    assert {m["to"] for m in node_plan.moves} <= {"h01", "h02", "h03"}
    plans.execute(node_plan, actor=admin_user)
    node_plan = wait_plan(node_plan, child)
    assert node_plan.state == "done"
    assert Hypervisor.objects.get(name="h00").state == "drained"
    group_plan = plans.compute("evacuate-group", actor=admin_user, target="rack-a", reason="rate-limit:2:rack")
    assert len(group_plan.moves) == 8 and {m["to"] for m in group_plan.moves} <= {"b00", "b01", "b02"}
    plans.execute(group_plan, actor=admin_user)
    group_plan = wait_plan(group_plan, child)
    assert group_plan.state == "done"
    for plan in (node_plan, group_plan):
        rows = Job.objects.filter(pk__in=[m["job"] for m in plan.moves])
        assert max_running_at_once(rows) <= 2
        assert all([f"rate-limit:2:plan-{plan.pk}", 2] in j.buckets for j in rows)
    assert max_running_at_once(Job.objects.filter(opcode="vm.migrate")) == 2  # it did run two at once


def test_a_squeeze_that_needs_room_powers_a_standby_host_on_before_moving_onto_it(
    make_host, image, admin_user, sync_jobs, redfish_bmc, bmc_host, settings
):
    settings.VCLMGR_BMC_TIMEOUT, settings.VCLMGR_BMC_POWER_SECONDS = 5, 30
    hosts, _ = build_cluster(make_host, image, admin_user, sync_jobs, full=2, empty=0, vms=6)
    emulator = redfish_bmc({"h09": "off", "h08": "on"})
    standby = bmc_host(make_host("h09", cpus=16, memory_mib=32768, disk_gib=500), emulator, "h09")
    Hypervisor.objects.filter(pk=standby.pk).update(
        state="offline", state_reason="powered off by plan 1", power_standby=True, power_state="off"
    )
    admins = bmc_host(make_host("h08", cpus=16, memory_mib=32768, disk_gib=500), emulator, "h08")
    inventory.set_state(admins, "offline", "broken PSU", actor="test")  # not on standby: never proposed
    snapshot.expire()
    plan = plans.compute("squeeze", actor=admin_user, options={"minimal_resources": 400, "target_resources": 400})
    assert plan.power_on == ["h09"] and plan.moves, plan.notes
    assert "h09" in {m["to"] for m in plan.moves}
    plan = plans.execute(plan, actor=admin_user)
    onto = [m for m in plan.moves if m["to"] == "h09"]
    wake = Job.objects.get(opcode="node.power_on")
    assert wake.params["node"] == "h09"
    assert all(wake.pk in [d[0] for d in Job.objects.get(pk=m["job"]).depends] for m in onto)
    sync_jobs.drain()
    plan = plans.refresh(Plan.objects.get(pk=plan.pk))
    assert plan.state == "done", (plan.moves, plan.jobs)
    assert emulator.power_state("h09") == "On"
    standby.refresh_from_db()
    assert (standby.state, standby.power_standby) == ("online", False)
    assert VM.objects.filter(host=standby, state="running").count() == len(onto)


def test_a_group_evacuation_drains_its_hosts_and_moves_their_future_reservations(
    make_host, image, admin_user, alice, sync_jobs
):
    from reservations import services as reservations

    rack_a, rack_b = NodeGroup.objects.create(name="rack-a"), NodeGroup.objects.create(name="rack-b")
    hosts, made = build_cluster(make_host, image, admin_user, sync_jobs, full=2, empty=0, vms=4, group=rack_a)
    later = timezone.now() + timedelta(hours=3)
    booked = [
        reservations.reserve(alice, image, start=later, end=later + timedelta(hours=1), actor=alice) for _ in range(2)
    ]
    assert {r.allocation.host_id for r in booked} <= {h.pk for h in hosts}
    others = [make_host(f"b{i:02d}", group=rack_b, cpus=16, memory_mib=32768, disk_gib=500) for i in range(2)]
    snapshot.expire()
    plan = plans.compute("evacuate-group", actor=admin_user, target="rack-a")
    assert len(plan.moves) == 4 and {m["to"] for m in plan.moves} <= {"b00", "b01"}
    moved_off = {c["allocation"] for c in plan.claims if c["effect"].startswith("re-placed")}
    assert moved_off == {r.allocation_id for r in booked}
    plans.execute(plan, actor=admin_user)
    for host in hosts:
        host.refresh_from_db()
        assert (host.state, host.state_reason) == ("drained", f"evacuating group rack-a: plan {plan.pk}")
    sync_jobs.drain()
    plan = plans.refresh(Plan.objects.get(pk=plan.pk))
    assert plan.state == "done", (plan.moves, plan.jobs)
    assert {j["opcode"] for j in plan.jobs} == {"node.replace_reservations"}
    assert set(VM.objects.filter(pk__in=[v.pk for v in made]).values_list("host_id", flat=True)) <= {
        h.pk for h in others
    }
    for reservation in booked:
        reservation.refresh_from_db()
        assert reservation.allocation.released is None, reservation.error
        assert reservation.allocation.host_id in {h.pk for h in others}
    assert not Allocation.objects.filter(host__in=hosts, released__isnull=True).exists()


def test_a_plan_ends_with_its_last_job_without_being_read(
    make_host, image, admin_user, alice, sync_jobs, django_capture_on_commit_callbacks
):
    from core.models import Event
    from reservations import services as reservations

    hosts, _ = build_cluster(make_host, image, admin_user, sync_jobs, full=1, empty=2, vms=2)
    for other in hosts[1:]:
        inventory.set_state(other, "drained", "the reservation goes to h00", actor="test")
    later = timezone.now() + timedelta(hours=3)
    booked = reservations.reserve(alice, image, start=later, end=later + timedelta(hours=1), actor=alice)
    for other in hosts[1:]:
        inventory.set_state(other, "online", "back", actor="test")
    snapshot.expire()
    plan = plans.execute(plans.compute("evacuate-node", actor=admin_user, target="h00"), actor=admin_user)
    assert [j["opcode"] for j in plan.jobs] == ["node.replace_reservations"]
    with django_capture_on_commit_callbacks(execute=True):
        sync_jobs.drain()
    plan = Plan.objects.get(pk=plan.pk)  # not refreshed: the jobs' ends brought it up to date
    assert plan.state == "done" and {r["status"] for r in [*plan.moves, *plan.jobs]} == {"success"}
    last = Event.objects.filter(topic=plans.topic(plan.pk), kind="plan.status").latest("id")
    assert last.data == {"plan": plan.pk, "state": "done", "moves": 2, "done": 2}
    booked.refresh_from_db()
    assert booked.allocation.host_id != hosts[0].pk


# --- refusals: nothing changed -------------------------------------------------------------------


def unchanged(before):
    return {v.pk: v.host_id for v in VM.objects.all()} == before and not Job.objects.filter(opcode="vm.migrate")


def test_a_stale_plan_is_refused_with_the_reason_or_recomputed(make_host, image, admin_user, sync_jobs):
    build_cluster(make_host, image, admin_user, sync_jobs)
    plan = plans.compute("balance", actor=admin_user)
    target = Hypervisor.objects.get(pk=plan.moves[0]["to_id"])
    inventory.set_state(target, "drained", "firmware", actor="test")
    before = {v.pk: v.host_id for v in VM.objects.all()}
    with pytest.raises(Conflict, match=f"plan {plan.pk} is stale: .*{target.name} is drained"):
        plans.execute(plan, actor=admin_user)
    assert unchanged(before) and Plan.objects.get(pk=plan.pk).state == "computed"
    plan = plans.execute(plan, actor=admin_user, recompute=True)
    assert plan.state == "executing" and target.name not in {m["to"] for m in plan.moves}
    assert any("recomputed" in note for note in plan.notes)
    with pytest.raises(Conflict, match="executed once"):
        plans.execute(plan, actor=admin_user)
    sync_jobs.drain()
    assert plans.refresh(plan).state == "done"


def test_a_vm_moved_meanwhile_makes_the_plan_stale(make_host, image, admin_user, sync_jobs):
    build_cluster(make_host, image, admin_user, sync_jobs)
    plan = plans.compute("balance", actor=admin_user)
    vm = VM.objects.get(pk=plan.moves[0]["vm"])
    services.submit_action(vm, "migrate", actor="test", target=plan.moves[-1]["to_id"])
    sync_jobs.drain()
    with pytest.raises(Conflict, match=f"is no longer on {plan.moves[0]['from']}"):
        plans.execute(plan, actor=admin_user)


def test_it_refuses_an_empty_group_the_last_online_host_and_unknown_targets(make_host, image, admin_user, sync_jobs):
    NodeGroup.objects.create(name="empty")
    build_cluster(make_host, image, admin_user, sync_jobs, full=1, empty=0, vms=2)
    for kind, target, group, message in [
        ("balance", "", "empty", "node group empty has no hosts"),
        ("evacuate-group", "empty", None, "node group empty has no hosts"),
        ("evacuate-node", "h00", None, "last online host"),
        ("evacuate-node", "nope", None, "no hypervisor named"),
        ("evacuate-group", "nope", None, "no node group named"),
    ]:
        with pytest.raises(Conflict, match=message):
            plans.compute(kind, actor=admin_user, target=target, group=group)
    with pytest.raises(Conflict, match="malformed rate-limit"):
        plans.compute("balance", actor=admin_user, reason="rate-limit:x:y")
    assert not Plan.objects.exists()


def test_drained_and_offline_hosts_never_receive_moves(make_host, image, admin_user, sync_jobs):
    hosts, _ = build_cluster(make_host, image, admin_user, sync_jobs, full=2, empty=4, vms=10)
    inventory.set_state(hosts[2], "drained", "maintenance", actor="test")
    inventory.set_state(hosts[3], "offline", "dead PSU", actor="test")
    plan = plans.compute("balance", actor=admin_user)
    assert plan.moves and not {m["to"] for m in plan.moves} & {hosts[2].name, hosts[3].name}


def test_a_future_reservation_is_never_broken_by_a_move(make_host, image, admin_user, sync_jobs):
    hosts, _ = build_cluster(make_host, image, admin_user, sync_jobs, full=1, empty=1, vms=8)
    future_claim(hosts[1], memory_mib=31744)  # the empty host is all taken later on
    plan = plans.compute("balance", actor=admin_user)
    assert all(m["to"] != hosts[1].name for m in plan.moves)  # an open-ended VM would overlap it


def test_squeeze_drains_the_emptied_hosts_that_have_no_bmc(make_host, image, admin_user, sync_jobs):
    hosts, _ = build_cluster(make_host, image, admin_user, sync_jobs, full=4, empty=0, vms=4)
    plan = plans.compute("squeeze", actor=admin_user)
    if not plan.power_off:
        pytest.fail(f"nothing to squeeze: {plan.notes}")
    plans.execute(plan, actor=admin_user)
    assert not Job.objects.filter(opcode="node.power_off").exists()
    sync_jobs.drain()
    for name in plan.power_off:
        host = Hypervisor.objects.get(name=name)
        assert host.state == "drained" and host.state_reason == f"emptied by plan {plan.pk}: no BMC to power it off"
        assert not VM.objects.filter(host=host, state__in=VM.LIVE).exists()


@pytest.mark.slow
def test_a_squeeze_powers_the_emptied_hosts_off_and_demand_powers_one_on(
    make_host, image, admin_user, alice, built, start_workers, redfish_bmc, bmc_host
):
    from reservations import services as reservations

    # Four hosts of 32 GiB with one 2 GiB VM each (the others drained while each is built), so
    # the squeeze moves VMs; a 31 GiB reservation then needs a whole empty host.
    hosts = []
    for i in range(4):
        for other in hosts:
            inventory.set_state(other, "drained", "building the next", actor="test")
        hosts += built(make_host, image, admin_user, full=1, empty=0, vms=1, prefix=f"h{i}")[0]
    for host in hosts:
        inventory.set_state(host, "online", "built", actor="test")
    snapshot.expire()
    assert len(set(VM.objects.values_list("host_id", flat=True))) == 4
    emulator = redfish_bmc({h.name: "on" for h in hosts})
    for host in hosts:
        bmc_host(host, emulator, host.name)
    plan = plans.compute("squeeze", actor=admin_user)
    assert plan.power_off and plan.moves, plan.notes
    child = start_workers(
        4,
        VCLMGR_BMC_TIMEOUT=5,
        VCLMGR_BMC_GRACEFUL_SECONDS=30,
        VCLMGR_BMC_POWER_SECONDS=30,
        VCLMGR_POWER_ON_BOOT_SECONDS=30,
    )
    plans.execute(plan, actor=admin_user)
    plan = wait_plan(plan, child, timeout=180)
    assert plan.state == "done", (plan.moves, plan.jobs)
    offs = Job.objects.filter(opcode="node.power_off")
    assert sorted(offs.values_list("params__node", flat=True)) == sorted(plan.power_off)
    for job in offs:
        emptying = Job.objects.filter(pk__in=[m["job"] for m in plan.moves if m["from"] == job.params["node"]])
        assert job.status == "success" and all(job.started >= e.ended for e in emptying), job.error_message
    for name in plan.power_off:
        assert emulator.power_state(name) == "Off"
        host = Hypervisor.objects.get(name=name)
        assert (host.state, host.power_state, host.power_standby) == ("offline", "off", True)
        assert host.state_reason.endswith(f"powered off by plan {plan.pk}")
        assert not VM.objects.filter(host=host, state__in=VM.LIVE).exists()
    online = [h for h in hosts if h.name not in plan.power_off]
    assert all(VM.objects.filter(host=h, state__in=VM.LIVE).exists() for h in online)  # none has 31 GiB free

    start = timezone.now()
    reservation = reservations.reserve(
        alice, image, start=start, end=start + timedelta(hours=1), size={"memory_mib": 31744}, actor=alice
    )
    woken = reservation.allocation.host
    assert woken.name in plan.power_off
    wait_until(
        lambda: (
            Job.objects.filter(opcode="vm.create").exists() and not Job.objects.exclude(status__in=Job.FINAL).exists()
        ),
        120,
        "the reservation to be built",
        child,
    )
    wake = Job.objects.get(opcode="node.power_on")
    assert wake.status == "success" and wake.params["node"] == woken.name, wake.error_message
    assert emulator.power_state(woken.name) == "On"
    woken.refresh_from_db()
    assert (woken.state, woken.power_standby) == ("online", False)
    reservation.refresh_from_db()
    assert reservation.status == "ready", reservation.error
    assert reservation.vm.host_id == woken.pk and reservation.vm.state == "running"
    for name in set(plan.power_off) - {woken.name}:
        assert emulator.power_state(name) == "Off"


def test_cancel_cancels_the_jobs_that_have_not_started(make_host, image, admin_user, sync_jobs):
    build_cluster(make_host, image, admin_user, sync_jobs)
    plan = plans.execute(plans.compute("balance", actor=admin_user), actor=admin_user)
    plan = plans.cancel(plan, actor=admin_user)
    assert plan.state == "canceled"
    assert set(Job.objects.filter(opcode="vm.migrate").values_list("status", flat=True)) == {"canceled"}
    with pytest.raises(Conflict):
        plans.execute(plan, actor=admin_user)


# --- API and CLI -----------------------------------------------------------------------------------


def test_the_api_is_for_staff_only(api, alice, admin_user, make_host, image, sync_jobs):
    build_cluster(make_host, image, admin_user, sync_jobs)
    user = api(alice)
    assert user.get("/api/v1/plans/").status_code == 403
    assert user.post("/api/v1/plans/", {"kind": "balance"}, format="json").status_code == 403
    staff = api(admin_user)
    made = staff.post("/api/v1/plans/", {"kind": "balance"}, format="json")
    assert made.status_code == 201, made.content
    pk = made.json()["id"]
    assert user.get(f"/api/v1/plans/{pk}/").status_code == 403
    assert user.post(f"/api/v1/plans/{pk}/execute/", {}, format="json").status_code == 403
    assert not Job.objects.filter(opcode="vm.migrate").exists()
    assert staff.post("/api/v1/plans/", {"kind": "balance", "bogus": 1}, format="json").status_code == 400
    assert staff.post("/api/v1/plans/", {"kind": "evacuate-node", "target": "nope"}, format="json").status_code == 409
    ran = staff.post(f"/api/v1/plans/{pk}/execute/", {}, format="json")
    assert ran.status_code == 202 and ran.json()["state"] == "executing"
    again = staff.post(f"/api/v1/plans/{pk}/execute/", {}, format="json")
    assert again.status_code == 409 and "executed once" in again.content.decode()
    assert staff.get("/api/v1/plans/").json()["results"][0]["id"] == pk
    assert staff.post(f"/api/v1/plans/{pk}/cancel/").status_code == 200


def test_cli_hbal_x_and_node_evacuate_dry_run(make_host, image, admin_user, sync_jobs):
    from io import StringIO

    from django.core.management import CommandError, call_command

    build_cluster(make_host, image, admin_user, sync_jobs)
    out = StringIO()
    call_command("node", "evacuate", "h00", "--dry-run", stdout=out)
    assert "Solution length=" in out.getvalue() and not Job.objects.filter(opcode="vm.migrate").exists()
    with pytest.raises(CommandError, match="no online host outside it"):
        call_command("group", "evacuate", "default", "--dry-run", stdout=StringIO())
    out = StringIO()
    call_command("hbal", "-L", "-X", "--reason", "rate-limit:3:rebalance", stdout=out)
    assert "under rate-limit:3:plan-" in out.getvalue()
    sync_jobs.drain()
    plan = plans.refresh(Plan.objects.filter(kind="balance").first())
    assert plan.state == "done" and plan.rate_limit == 3


def test_the_pages_show_the_moves_and_refuse_users(client, alice, admin_user, make_host, image, sync_jobs):
    build_cluster(make_host, image, admin_user, sync_jobs)
    client.force_login(alice)
    assert client.get("/vms/plans/").status_code == 403
    assert client.post("/vms/plans/new/", {"kind": "balance"}).status_code == 403
    client.force_login(admin_user)
    made = client.post("/vms/plans/new/", {"kind": "balance"})
    plan = Plan.objects.get()
    assert made.status_code == 302 and made.url == f"/vms/plans/{plan.pk}/"
    page = client.get(made.url).content.decode()
    assert plan.moves[0]["to"] in page and 'id="plan-utilisation"' in page and "plan_detail.js" in page
    assert "<script>" not in page and "style=" not in page
    client.post(f"/vms/plans/{plan.pk}/action/", {"action": "execute"})
    assert Plan.objects.get().state == "executing"
    again = client.post(f"/vms/plans/{plan.pk}/action/", {"action": "execute"}, follow=True)
    assert "executed once" in again.content.decode()
