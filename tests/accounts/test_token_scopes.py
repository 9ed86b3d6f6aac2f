"""API tokens with scopes and an expiry: a token never has more than its user, checked at each
request; used beyond its scope it is refused (403), after its expiry refused (401), and both are
logged without the token."""

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from accounts import access, tokens
from accounts.models import ApiToken
from inventory.models import NodeGroup
from jobs.models import Job

pytestmark = pytest.mark.django_db


def bearer(clear):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {clear}")
    return client


@pytest.fixture
def operator(django_user_model):
    user = django_user_model.objects.create_user("olga")
    access.set_roles(user, ["operator"], actor="test")
    return user


@pytest.mark.parametrize(
    "scopes,jobs,node_groups",
    [
        (("read",), 403, 403),
        (("read", "reserve"), 403, 403),
        (("run",), 202, 403),
        (("operate",), 403, 201),
        (("run", "operate"), 202, 201),
    ],
)
def test_each_write_needs_its_scope(operator, scopes, jobs, node_groups, caplog):
    row, clear = tokens.issue(operator, "ci", scopes=scopes)
    client = bearer(clear)
    assert client.get("/api/v1/hypervisors/").status_code == 200  # every token reads
    assert client.post("/api/v1/jobs/", {"opcode": "noop", "params": {}}, format="json").status_code == jobs
    assert client.post("/api/v1/node-groups/", {"name": "rack"}, format="json").status_code == node_groups
    assert Job.objects.count() == (1 if jobs == 202 else 0)
    assert NodeGroup.objects.count() == (1 if node_groups == 201 else 0)
    if 403 in (jobs, node_groups):
        assert f"API token {row.prefix}… ('ci') of olga refused" in caplog.text
    assert clear not in caplog.text


def test_reservations_need_the_reserve_scope(alice):
    _, run_only = tokens.issue(alice, "runner", scopes=("run",))
    _, reserve = tokens.issue(alice, "lms", scopes=("reserve",))
    body = {"image": 999999, "duration_minutes": 60}
    assert bearer(run_only).post("/api/v1/reservations/", body, format="json").status_code == 403
    assert bearer(reserve).post("/api/v1/reservations/", body, format="json").status_code == 400  # (no such image)


def test_a_demoted_users_token_loses_the_power_at_once(operator):
    _, clear = tokens.issue(operator, "ops", scopes=("operate",))
    assert bearer(clear).post("/api/v1/node-groups/", {"name": "a"}, format="json").status_code == 201
    access.set_roles(operator, [], actor="test")
    assert bearer(clear).post("/api/v1/node-groups/", {"name": "b"}, format="json").status_code == 403
    assert list(NodeGroup.objects.values_list("name", flat=True)) == ["a"]
    listed = bearer(clear).get("/api/v1/tokens/").json()["results"][0]
    assert listed["scopes"] == ["read", "operate"] and listed["effective_scopes"] == ["read"]


def test_a_token_is_never_given_more_than_its_user(alice, api, client):
    with pytest.raises(ValueError, match="may not have a token"):
        tokens.issue(alice, "greedy", scopes=("operate",))
    response = api(alice).post("/api/v1/tokens/", {"name": "x", "scopes": ["admin"]}, format="json")
    assert response.status_code == 400 and "admin" in response.json()["error"]["fields"]["scopes"][0]
    _, narrow = tokens.issue(alice, "narrow", scopes=("run",))
    response = bearer(narrow).post("/api/v1/tokens/", {"name": "wider", "scopes": ["reserve"]}, format="json")
    assert response.status_code == 400  # nor more than the token that asks
    client.force_login(alice)
    page = client.get("/tokens/").content.decode()
    assert 'value="operate"' not in page and 'value="reserve"' in page
    assert not ApiToken.objects.filter(name__in=["greedy", "x", "wider"]).exists()


def test_an_expired_token_is_refused_and_logged(alice, caplog):
    row, clear = tokens.issue(alice, "old", scopes=("run",), expires=timezone.now() + timedelta(hours=1))
    ApiToken.objects.filter(pk=row.pk).update(expires=timezone.now() - timedelta(seconds=1))
    response = bearer(clear).post("/api/v1/jobs/", {"opcode": "noop", "params": {}}, format="json")
    assert response.status_code == 401 and Job.objects.count() == 0
    assert f"API token {row.prefix}… ('old') of alice refused: expired" in caplog.text
    assert clear not in caplog.text


def test_the_token_list_shows_scopes_expiry_and_last_use(alice, client):
    expires = timezone.now() + timedelta(days=30)
    _, clear = tokens.issue(alice, "ci", scopes=("reserve", "run"), expires=expires)
    listed = bearer(clear).get("/api/v1/tokens/").json()["results"][0]
    assert listed["scopes"] == ["read", "reserve", "run"] and listed["effective_scopes"] == listed["scopes"]
    assert listed["expires"] and listed["last_used"]
    client.force_login(alice)
    html = client.get("/tokens/").content.decode()
    assert "read, reserve, run" in html and expires.strftime("%Y-%m-%d") in html


def test_the_websocket_and_events_api_follow_the_role_not_only_the_token(operator, alice):
    _, clear = tokens.issue(operator, "watch")
    assert bearer(clear).get("/api/v1/events/", {"topic": "admin"}).status_code == 200
    assert bearer(clear).get("/api/v1/events/", {"topic": f"user.{alice.pk}"}).status_code == 403
    access.set_roles(operator, [], actor="test")
    assert bearer(clear).get("/api/v1/events/", {"topic": "admin"}).status_code == 403


def test_the_rapi_needs_the_operate_scope_to_write(operator, make_host):
    make_host("node1")
    _, run_only = tokens.issue(operator, "r", scopes=("run",))
    _, ops = tokens.issue(operator, "o", scopes=("operate",))
    for clear, status in [(run_only, 403), (ops, 200)]:
        response = Client().generic(
            "PUT",
            "/2/nodes/node1/role",
            data=json.dumps("drained"),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {clear}",
        )
        assert response.status_code == status, response.content


@pytest.mark.django_db(transaction=True)
def test_the_migration_turns_write_enabled_into_the_scopes_the_role_allowed(django_user_model):
    executor = MigrationExecutor(connection)
    executor.migrate([("vclmgr", "0002_objectchange")])
    old = executor.loader.project_state([("vclmgr", "0002_objectchange")]).apps
    User, Token = old.get_model("auth", "User"), old.get_model("vclmgr", "ApiToken")
    staff, plain = User.objects.create(username="s", is_staff=True), User.objects.create(username="p")
    for n, (user, write) in enumerate([(staff, True), (plain, True), (plain, False)]):
        Token.objects.create(user=user, name=f"t{n}", prefix="vcl_x", digest=f"{n:064d}", write_enabled=write)

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())

    scopes = dict(ApiToken.objects.values_list("name", "scopes"))
    assert scopes == {"t0": access.SCOPES, "t1": ["read", "reserve", "run"], "t2": ["read"]}
