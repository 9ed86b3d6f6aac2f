"""A run's live topic through a real socket (daphne on loopback): its owner and staff follow it,
another user is refused it and hears nothing of it, whatever id they try."""

import pytest

from runs import services
from tests import processes
from tests.runs.helpers import submit

pytestmark = pytest.mark.slow


@pytest.fixture
def asgi_server(transactional_db, tmp_path):
    child = processes.start_asgi(tmp_path)
    yield child
    child.stop()


def test_another_users_run_topic_is_refused_and_its_events_never_arrive(
    sim_host, image, alice, bob, admin_user, session_cookie, ws_connect
):
    run = submit(alice)
    topic = f"run.{run.pk}"
    owner = ws_connect(cookie=session_cookie(alice))
    stranger = ws_connect(cookie=session_cookie(bob))
    staff = ws_connect(cookie=session_cookie(admin_user))

    assert owner.subscribe([topic])["topics"] == [topic]
    assert staff.subscribe([topic])["topics"] == [topic]
    refused = stranger.subscribe([topic, f"run.{run.pk + 1}", "run.0", "run.x", f"user.{alice.pk}"])
    assert refused["topics"] == []
    assert refused["denied"] == [topic, f"run.{run.pk + 1}", "run.0", "run.x", f"user.{alice.pk}"]

    services.cancel(run, actor=alice)  # an event on the run's topic (and its owner's)

    def canceled(message):
        data = message.get("data", {})
        return message["type"] == "event" and data.get("run") == run.pk and data.get("state") == "canceled"

    assert owner.receive_until(canceled, timeout=10)["topic"] == topic
    assert staff.receive_until(canceled, timeout=10)["topic"] == topic
    heard = []
    with pytest.raises(TimeoutError):
        stranger.receive_until(lambda m: heard.append(m) or False, timeout=3)
    assert [m for m in heard if m["type"] == "event"] == []
