"""A plain user cannot hold locks of their choosing: test opcodes are staff-only,
and an opcode users may submit takes its locks from what it does, never from the caller."""

import pytest

from jobs import registry
from jobs.models import Job

HOSTILE = [
    {"opcode": "test.sleep", "params": {"steps": 1000, "seconds": 60, "locks": ["cluster"]}},
    {"opcode": "test.sleep", "params": {"locks": ["vm:4"]}},
    {"opcode": "test.sleep", "params": {"shared_locks": ["hypervisor:1"]}},
    {"opcode": "test.fail", "params": {"after_steps": 100, "seconds": 60}},
]


@pytest.mark.parametrize("spec", HOSTILE)
def test_it_refuses_a_plain_users_lock_grab_and_queues_nothing(api, alice, spec, sync_jobs):
    response = api(alice).post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 403, response.json()
    assert response.json()["error"]["message"] == f"your role may not submit {spec['opcode']} jobs"
    response = api(alice).post("/api/v1/jobs/batch/", {"jobs": [{"opcode": "noop"}, spec]}, format="json")
    assert response.status_code == 403
    assert Job.objects.count() == 0


def test_it_refuses_them_on_the_page_too(client, alice, sync_jobs):
    client.force_login(alice)
    client.post(
        "/provisioning/jobs/submit/", {"opcode": "test.sleep", "params": '{"locks": ["cluster"]}', "priority": "0"}
    )
    assert Job.objects.count() == 0


def test_staff_may_still_take_test_locks(api, admin_user, sync_jobs):
    spec = {"opcode": "test.sleep", "params": {"locks": ["cluster"]}}
    assert api(admin_user).post("/api/v1/jobs/", spec, format="json").status_code == 202


def test_no_opcode_open_to_users_takes_lock_names_from_its_params():
    for op in registry.all_opcodes():
        if op.staff_only:
            continue
        fields = set(op.params().fields)
        assert not fields & {"locks", "shared_locks"}, f"{op.name} lets its caller name locks"
