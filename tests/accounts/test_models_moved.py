"""ApiToken, Access and SignOnIdentity moved from the core app (label ``vclmgr``) to accounts
without moving their data: a database of the old layout keeps its tokens, role grants and
sign-on identities, and a Schedule naming a moved function follows it."""

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django_q.models import Schedule
from rest_framework.test import APIClient

from accounts import access, tokens
from accounts.models import ApiToken, SignOnIdentity

OLD = [("vclmgr", "0004_signon_identity"), ("accounts", None)]
CLEAR = "vcl_" + "k" * 43  # a token as tokens.issue makes them


def _old_database():
    """Migrate back to the layout before the move; the old state's models."""
    executor = MigrationExecutor(connection)
    executor.migrate(OLD)
    return executor.loader.project_state([OLD[0], *executor.loader.graph.leaf_nodes("django_q")]).apps


def _migrate_to_the_end():
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())


def _rows_of_the_old_layout(old):
    User, Group = old.get_model("auth", "User"), old.get_model("auth", "Group")
    ContentType, Permission = old.get_model("contenttypes", "ContentType"), old.get_model("auth", "Permission")
    olga = User.objects.create(username="olga", is_active=True)
    old.get_model("vclmgr", "ApiToken").objects.create(
        user=olga, name="ci", prefix=CLEAR[:10], digest=tokens.digest(CLEAR), scopes=["read", "operate"]
    )
    old.get_model("vclmgr", "SignOnIdentity").objects.create(
        user=olga, method="oidc", issuer="https://idp.example.edu", subject="sub-1"
    )
    ct, _ = ContentType.objects.get_or_create(app_label="vclmgr", model="access")
    operate, _ = Permission.objects.get_or_create(content_type=ct, codename="operate", defaults={"name": "Operator"})
    group, _ = Group.objects.get_or_create(name="operator")
    group.permissions.add(operate)
    olga.groups.add(group)
    old.get_model("django_q", "Schedule").objects.create(
        name="vclmgr: retire users gone from the directory",
        func="vclmgr.signon.retire_gone",
        schedule_type="I",
        minutes=60,
        repeats=-1,
    )
    return olga.pk, operate.pk


# One test: migrating the whole graph back or forth costs seconds each time.
@pytest.mark.django_db(transaction=True)
def test_a_database_of_the_old_layout_keeps_its_tokens_roles_and_identities_and_the_move_migrates_back():
    olga_id, operate_id = _rows_of_the_old_layout(_old_database())

    _migrate_to_the_end()

    olga = get_user_model().objects.get(pk=olga_id)
    token = tokens.resolve(CLEAR)
    assert isinstance(token, ApiToken) and token.user == olga and token.scopes == ["read", "operate"]
    assert access.can(olga, "operate") and access.roles(olga) == ["operator"]
    # The same permission row, now the accounts app's: groups that held it still do.
    assert olga.groups.get(name="operator").permissions.get().pk == operate_id
    assert SignOnIdentity.objects.get(user=olga).subject == "sub-1"
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {CLEAR}")
    assert client.get("/api/v1/me/").json()["roles"] == ["operator"]
    assert Schedule.objects.get(func__endswith="retire_gone").func == "accounts.signon.retire_gone"

    # And back.
    old = _old_database()

    assert old.get_model("vclmgr", "ApiToken").objects.get().name == "ci"
    assert old.get_model("vclmgr", "SignOnIdentity").objects.count() == 1
    assert old.get_model("contenttypes", "ContentType").objects.filter(app_label="vclmgr", model="access").exists()
    schedule = old.get_model("django_q", "Schedule").objects.get(func__endswith="retire_gone")
    assert schedule.func == "vclmgr.signon.retire_gone"
    _migrate_to_the_end()
