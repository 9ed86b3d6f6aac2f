"""Waking workers: the tokens a submission leaves in the real broker (ORM, or Redis with CI).

A job is started by a worker that runs a ``run_next`` token; a job left without one waits
for the janitor's next round (seconds). These tests read what waits in the broker.
"""

import pytest
from django_q.brokers import get_broker
from django_q.signing import SignedPackage

from jobs import wake
from notifications import tasks as notifications
from tests.jobs.helpers import submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def broker():
    found = get_broker()
    found.purge_queue()  # with Redis, the queue outlives the rows of the test before
    yield found
    found.purge_queue()


def waiting(broker):
    """The functions of the tasks waiting in the broker, in order."""
    if wake._orm_broker():
        payloads = broker.get_connection().filter(key=broker.list_key).values_list("payload", flat=True)
    else:
        payloads = broker.connection.lrange(broker.list_key, 0, -1)
    return [SignedPackage.loads(payload)["func"] for payload in payloads]


def test_a_notification_task_waiting_in_the_broker_is_not_a_jobs_token(broker, django_capture_on_commit_callbacks):
    notifications.kick()  # a mail to send, queued a moment before (a reservation became ready)
    with django_capture_on_commit_callbacks(execute=True):
        submit()
    assert waiting(broker) == ["notifications.tasks.send_due", wake.RUN_NEXT]


def test_a_job_submitted_while_anothers_token_waits_gets_its_own(broker, django_capture_on_commit_callbacks):
    # A reservation ended (its teardown queued, its token not yet taken by the pusher), then
    # the next one's build: each needs a worker now.
    with django_capture_on_commit_callbacks(execute=True):
        submit("test.sleep", {"locks": ["vm:1"]})
    with django_capture_on_commit_callbacks(execute=True):
        submit("test.sleep", {"locks": ["vm:2"]})
    assert waiting(broker) == [wake.RUN_NEXT, wake.RUN_NEXT]


def test_tokens_are_topped_up_to_the_local_workers_not_piled_up(broker, django_capture_on_commit_callbacks):
    for _ in range(wake.local_workers() + 3):
        with django_capture_on_commit_callbacks(execute=True):
            submit()
    assert waiting(broker) == [wake.RUN_NEXT] * wake.local_workers()
