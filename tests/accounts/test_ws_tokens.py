"""Websockets opened with an API token: no Origin needed (a token is not a
cookie), never a fall-back to the cookie when the token is wrong, and a revoked token's
stream ends."""

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from accounts import tokens
from tests import processes

pytestmark = pytest.mark.slow


# One daphne for the module: what the tests prove is how a running server treats each socket's
# credentials, not how it starts; what it keeps between tests is in the database.
asgi_process = processes.shared(processes.start_asgi, WS_TOKEN_RECHECK_SECONDS="0.3")  # noqa: S106 (seconds)
transactional_db, db = processes.committed_db, processes.committed_db_too


@pytest.fixture
def asgi_server(transactional_db, asgi_process):
    return asgi_process.begin()


def test_a_token_client_without_an_origin_is_served(alice, ws_connect):
    _, clear = tokens.issue(alice, "ws")
    ws = ws_connect(headers={"Authorization": f"Bearer {clear}"}, no_origin=True)
    assert ws.subscribe([f"user.{alice.pk}"])["topics"] == [f"user.{alice.pk}"]


def test_a_cookie_session_still_needs_the_origin(alice, session_cookie, ws_connect):
    with pytest.raises(InvalidStatus):
        ws_connect(cookie=session_cookie(alice), no_origin=True)


def test_a_wrong_token_does_not_fall_back_to_the_cookie(alice, session_cookie, ws_connect):
    ws = ws_connect(cookie=session_cookie(alice), headers={"Authorization": "Bearer vcl_wrong"})
    with pytest.raises(ConnectionClosed) as closed:
        ws.receive(timeout=5)
    assert closed.value.rcvd.code == 4401


def test_a_revoked_tokens_socket_is_closed(alice, ws_connect):
    row, clear = tokens.issue(alice, "ws")
    ws = ws_connect(headers={"Authorization": f"Bearer {clear}"})
    ws.subscribe([f"user.{alice.pk}"])

    assert tokens.revoke(alice, row.pk)

    with pytest.raises(ConnectionClosed) as closed:
        ws.receive_until(lambda m: False, timeout=5)
    assert closed.value.rcvd.code == 4401
