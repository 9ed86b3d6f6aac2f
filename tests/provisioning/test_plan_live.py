"""A plan's live progress on ``plan.<id>`` over the real websocket server (daphne in its own
process), while real workers run its moves: staff follow it, a user is refused."""

from datetime import timedelta

import pytest
from django.utils import timezone

from capacity.snapshot import snapshot
from inventory import services as inventory
from jobs.models import Job
from provisioning import plans
from provisioning.models import Plan
from tests.processes import wait_for

pytestmark = pytest.mark.slow


def receive_plan_events(ws, timeout=60):
    """Every plan event with the moment it arrived, until the plan's final status."""
    deadline = timezone.now() + timedelta(seconds=timeout)
    got = []
    while True:
        left = (deadline - timezone.now()).total_seconds()
        try:
            message = ws.receive_until(lambda m: m["type"] == "event" and m["kind"].startswith("plan."), timeout=left)
        except TimeoutError:
            raise AssertionError(f"no final plan.status within {timeout}s; got {[m for _, m in got]}") from None
        got.append((timezone.now(), message))
        if message["kind"] == "plan.status" and message["data"]["state"] in Plan.FINAL:
            return got


def test_staff_follow_a_plan_move_by_move_and_a_user_is_refused(
    make_host, image, admin_user, alice, built, start_workers, session_cookie, ws_connect
):
    from reservations import services as reservations

    # A second per migration: the relay (polling every 0.2 s) has time to hand each move on
    # before the next one ends, also on a loaded machine.
    slow = {"driver_options": {"delay": {"migrate": 1.0}}}
    hosts, made = built(make_host, image, admin_user, full=1, empty=2, vms=4, **slow)
    # A future reservation on the host: its evacuation also re-places it (one more job to wait for).
    for other in hosts[1:]:
        inventory.set_state(other, "drained", "the reservation goes to h00", actor="test")
    later = timezone.now() + timedelta(hours=3)
    booked = reservations.reserve(alice, image, start=later, end=later + timedelta(hours=1), actor=alice)
    assert booked.allocation.host_id == hosts[0].pk
    for other in hosts[1:]:
        inventory.set_state(other, "online", "back", actor="test")
    snapshot.expire()
    plan = plans.compute("evacuate-node", actor=admin_user, target="h00", reason="rate-limit:1:one at a time")
    assert len(plan.moves) == 4 and [c["allocation"] for c in plan.claims] == [booked.allocation_id]
    topic = f"plan.{plan.pk}"

    spy = ws_connect(cookie=session_cookie(alice))
    refused = spy.subscribe([topic])
    assert (refused["topics"], refused["denied"]) == ([], [topic])
    ws = ws_connect(cookie=session_cookie(admin_user))
    assert ws.subscribe([topic])["topics"] == [topic]

    child = start_workers(2)
    plans.execute(plan, actor=admin_user)
    got = receive_plan_events(ws)
    kinds = [(m["kind"], m["data"].get("state") or m["data"].get("status")) for _, m in got]
    assert kinds == [("plan.status", "executing"), *[("plan.move", "success")] * 4, ("plan.status", "done")], kinds
    moves = [m["data"] for _, m in got if m["kind"] == "plan.move"]
    assert sorted(m["index"] for m in moves) == [0, 1, 2, 3] and {m["to"] for m in moves} <= {"h01", "h02"}
    assert got[-1][1]["data"] == {"plan": plan.pk, "state": "done", "moves": 4, "done": 4}
    # Live, not at the end: each move's event arrived before the next move ended.
    # The plan is done once the last move's outcome is written, in its job's last step: a
    # moment before that job's own row ends.
    jobs = Job.objects.filter(pk__in=[m["job"] for m in moves])
    wait_for(lambda: not jobs.filter(ended=None).exists(), 30, "the move jobs' ends", child)
    ended = sorted(jobs.values_list("ended", flat=True))
    arrived = [when for when, m in got if m["kind"] == "plan.move"]
    assert all(arrived[i] < ended[i + 1] for i in range(3)), (arrived, ended)
    replaced = Job.objects.get(opcode="node.replace_reservations")
    assert replaced.status == "success" and got[-1][0] >= replaced.ended
    assert Plan.objects.get(pk=plan.pk).state == "done"  # settled without anyone reading the plan
    with pytest.raises(TimeoutError):  # the refused subscriber got nothing of it
        spy.receive_until(lambda m: m["type"] == "event", timeout=1)
    assert child.alive()
