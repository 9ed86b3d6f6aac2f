"""Ganeti's job filter rules: decided in process (pure), stored and applied through /2/filters."""

import pytest

from inventory.models import Hypervisor
from jobs.models import Job
from rapi.job_filters import check_rule, decide
from rapi.models import FilterRule
from rapi.qfilter import FilterError
from tests.rapi.test_protocol import ADMIN, ALICE, call

JOB = {"id": 40, "ops": [{"OP_ID": "OP_NODE_SET_PARAMS", "role": "drained"}], "reason": [["gnt:rapi", "maint", 7]]}


def rule(action, *predicates, priority=0, watermark=30, uuid="a"):
    return {
        "uuid": uuid,
        "priority": priority,
        "watermark": watermark,
        "predicates": list(predicates),
        "action": action,
    }


def test_the_first_matching_rule_by_priority_decides_and_continue_passes_on():
    rules = [
        rule("ACCEPT", ["opcode", ["=", "OP_ID", "OP_NODE_SET_PARAMS"]], priority=5, uuid="late"),
        rule("REJECT", ["reason", ["=~", "reason", "^maint"]], priority=1, uuid="early"),
        rule("CONTINUE", priority=0, uuid="first"),
    ]
    action, decided = decide(rules, JOB)
    assert (action, decided["uuid"]) == ("REJECT", "early")


def test_the_watermark_and_every_predicate_must_hold():
    newer = rule("REJECT", ["jobid", [">", "id", "watermark"]], ["opcode", ["=", "role", "drained"]])
    assert decide([newer], JOB)[0] == "REJECT"
    assert decide([{**newer, "watermark": 40}], JOB) == ("ACCEPT", None)
    other = rule("REJECT", ["jobid", [">", "id", "watermark"]], ["opcode", ["=", "role", "offline"]])
    assert decide([other], JOB) == ("ACCEPT", None)


@pytest.mark.parametrize(
    ("priority", "predicates", "action", "reason"),
    [
        (-1, [], "REJECT", "non-negative"),
        (0, [["colour", ["=", "x", 1]]], "REJECT", "Invalid predicate"),
        (0, [["jobid", ["~", "id", 1]]], "REJECT", "Unknown operator"),
        (0, [["reason", ["=", "who", "x"]]], "REJECT", "Unknown field 'who'"),
        (0, [], "DROP", "Unknown filter action"),
        (0, [], ["PAUSE", 1], "PAUSE takes no argument"),
        (0, [], ["RATE_LIMIT", 0], r"RATE_LIMIT is \["),
        (0, [], "RATE_LIMIT", r"RATE_LIMIT is \["),
    ],
)
def test_it_refuses_a_rule_it_cannot_store_or_apply(priority, predicates, action, reason):
    with pytest.raises(FilterError, match=reason):
        check_rule(priority, predicates, action)


@pytest.mark.django_db
def test_filters_are_stored_listed_replaced_and_deleted(admin_user, alice):
    body = {"priority": 1, "predicates": [["opcode", ["=", "OP_ID", "OP_TAGS_SET"]]], "action": "REJECT", "reason": []}
    status, made, _ = call("POST", "/2/filters", ADMIN, body)
    assert status == 200 and FilterRule.objects.get().action == "REJECT"
    status, row, _ = call("GET", f"/2/filters/{made}", ADMIN)
    assert (row["uuid"], row["priority"], row["predicates"]) == (made, 1, body["predicates"])
    status, same, _ = call("PUT", f"/2/filters/{made}", ADMIN, {**body, "action": "ACCEPT"})
    assert same == made and FilterRule.objects.get().action == "ACCEPT"
    assert call("GET", "/2/filters", ADMIN)[1] == [{"uuid": made, "uri": f"/2/filters/{made}"}]
    assert call("GET", "/2/filters", ALICE)[0] == 403 and call("POST", "/2/filters", ALICE, body)[0] == 403
    assert call("DELETE", f"/2/filters/{made}", ADMIN)[:2] == (200, None)
    assert call("GET", f"/2/filters/{made}", ADMIN)[0] == 404 and not FilterRule.objects.exists()


@pytest.mark.django_db
def test_a_bad_rule_is_ganetis_400_with_its_reason(admin_user):
    status, error, _ = call(
        "POST", "/2/filters", ADMIN, {"predicates": [["jobid", ["<>", "id", 1]]], "action": "REJECT"}
    )
    assert status == 400 and "Unknown operator '<>'" in error["message"]
    assert call("POST", "/2/filters", ADMIN, {"action": ["RATE_LIMIT", True]})[0] == 400
    assert not FilterRule.objects.exists()


@pytest.mark.django_db
def test_a_rejected_job_is_canceled_as_it_is_submitted_and_others_pass(admin_user, make_host):
    make_host("node1")
    reject = {"predicates": [["opcode", ["=", "OP_ID", "OP_TAGS_SET"]]], "action": "REJECT"}
    assert call("POST", "/2/filters", ADMIN, reject)[0] == 200
    status, tagged, _ = call("PUT", "/2/nodes/node1/tags?tag=rack", ADMIN)
    assert status == 200 and Job.objects.get(pk=tagged).status == "canceled"
    assert "rejected by job filter" in Job.objects.get(pk=tagged).error_message
    status, role, _ = call("PUT", "/2/nodes/node1/role", ADMIN, body="drained")
    assert status == 200 and Job.objects.get(pk=role).status == "queued"
    assert Hypervisor.objects.get().state == "online"


@pytest.mark.django_db
def test_a_paused_job_stays_queued_until_its_rule_goes(admin_user, make_host, sync_jobs):
    make_host("node1")
    pause = {"predicates": [["opcode", ["=", "OP_ID", "OP_TAGS_SET"]]], "action": "PAUSE"}
    rule = call("POST", "/2/filters", ADMIN, pause)[1]
    tagged = call("PUT", "/2/nodes/node1/tags?tag=rack", ADMIN)[1]
    assert Job.objects.get(pk=tagged).buckets == [[f"filter:{rule}", 0]]
    sync_jobs.drain()
    assert Job.objects.get(pk=tagged).status == "queued"
    assert call("PUT", f"/2/filters/{rule}", ADMIN, {**pause, "action": ["RATE_LIMIT", 1]})[0] == 200
    assert Job.objects.get(pk=tagged).buckets == [[f"filter:{rule}", 1]]  # screened again: now limited
    assert call("DELETE", f"/2/filters/{rule}", ADMIN)[0] == 200
    assert Job.objects.get(pk=tagged).buckets == []
    sync_jobs.drain()
    assert Job.objects.get(pk=tagged).status == "success"
    assert list(Hypervisor.objects.get().tags.names()) == ["rack"]


@pytest.mark.django_db
def test_a_rate_limit_lets_n_of_the_rules_jobs_run_at_once(admin_user, make_host):
    from jobs import dispatcher

    make_host("node1")
    make_host("node2")
    limit = {"predicates": [["opcode", ["=", "OP_ID", "OP_TAGS_SET"]]], "action": ["RATE_LIMIT", 1]}
    assert call("POST", "/2/filters", ADMIN, limit)[0] == 200
    first = call("PUT", "/2/nodes/node1/tags?tag=a", ADMIN)[1]
    second = call("PUT", "/2/nodes/node2/tags?tag=b", ADMIN)[1]
    claimed = dispatcher.claim_next()
    assert claimed.id == first and dispatcher.claim_next() is None  # the second waits for the first
    assert Job.objects.get(pk=second).status == "queued"
