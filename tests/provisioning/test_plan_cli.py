"""``manage.py plan`` and the commands that reach it by name (``hbal -X``, ``hsqueeze -X``,
``node evacuate``, ``group evacuate``): run with ``call_command`` on a sim cluster, their jobs
run in this process (``sync_jobs``) or by real workers. The commands live in capacity and
inventory, but what they execute is this app's plans, so their execution is tested here."""

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from capacity.snapshot import snapshot
from inventory import services as inventory
from inventory.models import Hypervisor, NodeGroup
from jobs.models import Job
from provisioning import plans, services
from provisioning.models import VM, Plan
from tests.provisioning.plan_helpers import build_cluster, max_running_at_once, wait_plan


def run(*args):
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def where():
    return dict(VM.objects.values_list("pk", "host__name"))


def migrations(plan):
    return Job.objects.filter(opcode="vm.migrate", params__plan=plan.pk)


def settled(plan):
    return plans.refresh(Plan.objects.get(pk=plan.pk))


# --- plan: every subcommand ------------------------------------------------------------------


def test_plan_balance_list_and_show_report_the_stored_dry_run(make_host, image, admin_user, sync_jobs):
    build_cluster(make_host, image, admin_user, sync_jobs)
    before = where()
    out = run("plan", "balance", "--max-moves", "3", "--reason", "rate-limit:2:tuesday")
    plan = Plan.objects.get()
    assert (plan.kind, plan.state, plan.rate_limit, len(plan.moves)) == ("balance", "computed", 2, 3)
    assert out.startswith(f"Plan {plan.pk} (balance , computed)\n")
    assert "Solution length=3\n" in out and plan.moves[0]["name"] in out
    assert where() == before and not Job.objects.filter(opcode="vm.migrate").exists()

    listing = run("plan", "list").splitlines()
    assert listing[0].split() == ["ID", "Kind", "State", "Target", "Moves", "Score", "After"]
    assert listing[1].split()[:4] == [str(plan.pk), "balance", "computed", "3"]
    assert run("plan", "show", str(plan.pk)) == out
    shown = json.loads(run("plan", "show", str(plan.pk), "--json"))
    assert shown["id"] == plan.pk and shown["state"] == "computed" and len(shown["moves"]) == 3
    assert shown["reason"] == "rate-limit:2:tuesday"
    with pytest.raises(CommandError, match="no plan 999999"):
        run("plan", "show", "999999")


def test_plan_execute_moves_the_vms_and_refuses_a_second_run(make_host, image, admin_user, sync_jobs):
    build_cluster(make_host, image, admin_user, sync_jobs)
    run("plan", "balance", "--rate-limit", "3")
    plan = Plan.objects.get()
    out = run("plan", "execute", str(plan.pk))
    assert out == f"plan {plan.pk}: executing, {len(plan.moves)} jobs under rate-limit:3:plan-{plan.pk}\n"
    assert {tuple(j.buckets[0]) for j in migrations(plan)} == {(f"rate-limit:3:plan-{plan.pk}", 3)}
    sync_jobs.drain()
    moved = where()
    assert all(moved[m["vm"]] == m["to"] for m in plan.moves)
    shown = run("plan", "show", str(plan.pk))
    assert f"Plan {plan.pk} (balance , done)" in shown and shown.count(" success\n") == len(plan.moves)
    assert set(VM.objects.values_list("state", flat=True)) == {"running"}
    with pytest.raises(CommandError, match=f"plan {plan.pk} is done: a plan is executed once"):
        run("plan", "execute", str(plan.pk))
    assert migrations(plan).count() == len(plan.moves)  # nothing submitted again
    assert run("plan", "list").splitlines()[1].split()[2] == "done"


def test_plan_execute_refuses_a_stale_plan_and_recompute_runs_a_fresh_one(make_host, image, admin_user, sync_jobs):
    build_cluster(make_host, image, admin_user, sync_jobs)
    run("plan", "balance")
    plan = Plan.objects.get()
    target = Hypervisor.objects.get(pk=plan.moves[0]["to_id"])
    run("node", "modify", target.name, "--drained=yes", "--reason", "firmware")
    before = where()
    with pytest.raises(CommandError, match=f"plan {plan.pk} is stale: .*{target.name} is drained"):
        run("plan", "execute", str(plan.pk))
    assert where() == before and not Job.objects.filter(opcode="vm.migrate").exists()
    assert Plan.objects.get(pk=plan.pk).state == "computed"

    out = run("plan", "execute", str(plan.pk), "--recompute")
    assert f"plan {plan.pk}: executing" in out
    sync_jobs.drain()
    plan = settled(plan)
    assert plan.state == "done" and any(note.startswith("recomputed at execution") for note in plan.notes)
    assert not VM.objects.filter(host=target).exclude(pk__in=[pk for pk, h in before.items() if h == target.name])


def test_plan_cancel_stops_the_moves_not_started(make_host, image, admin_user, sync_jobs):
    build_cluster(make_host, image, admin_user, sync_jobs)
    before = where()
    run("plan", "balance", "-X")
    plan = Plan.objects.get()
    assert plan.state == "executing" and migrations(plan).count() == len(plan.moves)
    assert run("plan", "cancel", str(plan.pk)) == f"plan {plan.pk}: canceled\n"
    assert set(migrations(plan).values_list("status", flat=True)) == {"canceled"}
    sync_jobs.drain()
    assert where() == before
    with pytest.raises(CommandError, match=f"plan {plan.pk} is canceled already"):
        run("plan", "cancel", str(plan.pk))
    with pytest.raises(CommandError, match="executed once"):
        run("plan", "execute", str(plan.pk))
    run("plan", "balance")
    computed = Plan.objects.first()
    run("plan", "cancel", str(computed.pk))  # a dry run is simply closed
    assert Plan.objects.get(pk=computed.pk).state == "canceled" and where() == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan", "evacuate-group", "nope"], "no node group named 'nope'"),
        (["plan", "evacuate-node", "nope"], "no hypervisor named 'nope'"),
        (["plan", "balance", "-G", "nope"], "no node group named 'nope'"),
        (["plan", "balance", "--reason", "rate-limit:x:y"], "malformed rate-limit"),
        (["plan", "balance", "--rate-limit", "0"], "rate_limit must be between 1 and 10000"),
        (["plan", "balance", "--rate-limit", "3", "--reason", "rate-limit:2:x"], "says rate-limit 2"),
        (["plan", "execute", "999999"], "no plan 999999"),
        (["plan", "cancel", "999999"], "no plan 999999"),
        (["group", "evacuate", "nope"], "no node group named 'nope'"),
        (["node", "evacuate", "nope"], "no hypervisor named 'nope'"),
        (["hsqueeze", "-X", "-t", "cluster.txt"], "not with -t/--ganeti-file"),
    ],
)
def test_the_commands_refuse_bad_input_with_the_reason(make_host, image, admin_user, sync_jobs, args, message):
    build_cluster(make_host, image, admin_user, sync_jobs, full=2, empty=1, vms=4)
    before = where()
    with pytest.raises(CommandError, match=message):
        run(*args)
    assert not Plan.objects.exists() and where() == before


# --- hsqueeze -X ---------------------------------------------------------------------------------


def one_vm_per_host(make_host, image, admin_user, sync_jobs, hosts=4):
    """``hosts`` hosts with one small VM each (built on the first, then migrated out)."""
    hosts, made = build_cluster(make_host, image, admin_user, sync_jobs, full=1, empty=hosts - 1, vms=hosts)
    for vm, host in zip(made[1:], hosts[1:], strict=True):
        services.submit_action(VM.objects.get(pk=vm.pk), "migrate", actor="test", target=host.pk)
    sync_jobs.drain()
    snapshot.expire()
    assert sorted(where().values()) == [h.name for h in hosts]
    return hosts, made


def test_hsqueeze_x_moves_the_vms_off_and_drains_the_emptied_hosts(make_host, image, admin_user, sync_jobs):
    hosts, made = one_vm_per_host(make_host, image, admin_user, sync_jobs)
    out = run("hsqueeze", "-X", "--reason", "rate-limit:2:night")
    plan = Plan.objects.get()
    assert plan.kind == "squeeze" and plan.rate_limit == 2 and plan.power_off and plan.moves, plan.notes
    assert f"Power off: {', '.join(plan.power_off)}" in out
    assert f"plan {plan.pk}: executing, {len(plan.moves)} jobs under rate-limit:2:plan-{plan.pk}" in out
    # The plan's own bucket, and the reason's label's (shared with any job under that reason).
    assert all(j.buckets == [["rate-limit:2:night", 2], [plan.bucket, 2]] for j in migrations(plan))
    for name in plan.power_off:  # nothing new lands on them while they empty
        assert Hypervisor.objects.get(name=name).state == "drained"
    sync_jobs.drain()
    assert settled(plan).state == "done"
    emptied = set(plan.power_off)
    assert not VM.objects.filter(host__name__in=emptied).exists()
    assert set(VM.objects.filter(pk__in=[v.pk for v in made]).values_list("state", flat=True)) == {"running"}
    assert len(set(where().values())) == len(hosts) - len(emptied)


def test_hsqueeze_x_passes_its_thresholds_to_the_plan(make_host, image, admin_user, sync_jobs):
    one_vm_per_host(make_host, image, admin_user, sync_jobs)
    assert plans.compute("squeeze", actor=admin_user).power_off  # by default, hosts are emptied
    dry = plans.compute("squeeze", actor=admin_user, options={"target_resources": 400, "minimal_resources": 400})
    assert not dry.power_off  # at that much room to keep, none
    run("hsqueeze", "-X", "--target-resources", "400", "--minimal-resources", "400")
    plan = Plan.objects.first()
    assert (plan.options["target_resources"], plan.options["minimal_resources"]) == (400.0, 400.0)
    assert plan.power_off == dry.power_off and plan.moves == [] and plan.state == "done"
    assert not migrations(plan).exists()


# --- node evacuate -------------------------------------------------------------------------------


def test_node_evacuate_executes_unless_dry_run(make_host, image, admin_user, sync_jobs):
    hosts, made = build_cluster(make_host, image, admin_user, sync_jobs, full=1, empty=2, vms=4)
    dry = run("node", "evacuate", "h00", "--dry-run")
    assert "Solution length=4" in dry and Plan.objects.get().state == "computed"
    assert Hypervisor.objects.get(name="h00").state == "online" and not Job.objects.filter(opcode="vm.migrate")
    out = run("node", "evacuate", "h00", "--reason", "rate-limit:1:firmware")
    plan = Plan.objects.first()
    assert (plan.kind, plan.target, plan.rate_limit) == ("evacuate-node", "h00", 1)
    assert f"plan {plan.pk}: executing, 4 jobs under rate-limit:1:plan-{plan.pk}" in out
    assert Hypervisor.objects.get(name="h00").state_reason == f"evacuating: plan {plan.pk}"
    sync_jobs.drain()
    assert settled(plan).state == "done"
    assert set(where().values()) <= {"h01", "h02"}
    run("node", "modify", "h02", "--drained=yes", "--reason", "psu")
    with pytest.raises(CommandError, match="cannot evacuate h01: it is the last online host of the cluster"):
        run("node", "evacuate", "h01")
    assert Plan.objects.count() == 2 and Hypervisor.objects.get(name="h01").state == "online"


# --- group evacuate --------------------------------------------------------------------------------


def racks():
    return NodeGroup.objects.create(name="rack-a"), NodeGroup.objects.create(name="rack-b")


def test_group_evacuate_executes_the_plan_and_empties_the_group(make_host, image, admin_user, sync_jobs):
    rack_a, rack_b = racks()
    hosts, made = build_cluster(make_host, image, admin_user, sync_jobs, full=2, empty=0, vms=6, group=rack_a)
    others = [make_host(f"b{i:02d}", group=rack_b, cpus=16, memory_mib=32768, disk_gib=500) for i in range(2)]
    snapshot.expire()
    out = run("group", "evacuate", "rack-a", "--reason", "rate-limit:2:rack move")
    plan = Plan.objects.get()
    assert (plan.kind, plan.target, plan.state, len(plan.moves)) == ("evacuate-group", "rack-a", "executing", 6)
    assert f"jobs under rate-limit:2:plan-{plan.pk}" in out
    for host in hosts:
        host.refresh_from_db()
        assert (host.state, host.state_reason) == ("drained", f"evacuating group rack-a: plan {plan.pk}")
    sync_jobs.drain()
    assert settled(plan).state == "done"
    assert set(where().values()) <= {h.name for h in others}
    assert set(VM.objects.values_list("state", flat=True)) == {"running"}
    with pytest.raises(CommandError, match="node group rack-a holds no VMs: nothing to evacuate"):
        run("group", "evacuate", "rack-a")


def test_group_evacuate_refuses_when_no_host_outside_is_online(make_host, image, admin_user, sync_jobs):
    rack_a, rack_b = racks()
    build_cluster(make_host, image, admin_user, sync_jobs, full=1, empty=0, vms=2, group=rack_a)
    other = make_host("b00", group=rack_b, cpus=16, memory_mib=32768, disk_gib=500)
    inventory.set_state(other, "drained", "maintenance", actor="test")
    before = where()
    with pytest.raises(CommandError, match="cannot evacuate group rack-a: no online host outside it"):
        run("group", "evacuate", "rack-a")
    assert where() == before and not Plan.objects.exists()
    assert Hypervisor.objects.get(name="h00").state == "online"


@pytest.mark.slow
def test_group_evacuate_through_real_workers_keeps_its_rate_limit(make_host, image, admin_user, built, start_workers):
    slow = {"driver_options": {"delay": {"migrate": 0.3}}}
    rack_a, rack_b = racks()
    hosts, made = built(make_host, image, admin_user, full=2, empty=0, vms=8, group=rack_a, **slow)
    others = [make_host(f"b{i:02d}", group=rack_b, cpus=16, memory_mib=32768, disk_gib=500, **slow) for i in range(3)]
    snapshot.expire()
    child = start_workers(4)
    out = run("plan", "evacuate-group", "rack-a", "--reason", "rate-limit:2:rack move", "--wait")
    plan = wait_plan(Plan.objects.get(), child)
    assert out.endswith(f"plan {plan.pk}: done\n") and plan.state == "done"
    rows = migrations(plan)
    assert rows.count() == 8 and max_running_at_once(rows) == 2  # two at once, never more
    assert set(VM.objects.filter(pk__in=[v.pk for v in made]).values_list("host__name", flat=True)) <= {
        h.name for h in others
    }
