"""LDAP sign-on against a real OpenLDAP (Debian's slapd, started here on a loopback port, loaded
from tests/data/ldap/directory.ldif): through the real login form, the admin's and the RAPI's
basic auth; groups mapped from the directory drive image visibility and quotas."""

import base64
import json
import socket
from io import StringIO

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command
from django.test import Client

from accounts import signon, tokens
from accounts.ldap_config import ldap_settings
from accounts.models import SignOnIdentity
from core.env import Env
from core.models import ObjectChange
from provisioning import quotas
from provisioning.models import Image, QuotaRule
from tests.ldap_server import BASE, Directory, missing_tools

pytestmark = pytest.mark.django_db

PEOPLE, GROUPS = f"ou=people,{BASE}", f"ou=groups,{BASE}"
GROUP_MAP = {
    f"cn=cs101,{GROUPS}": "cs101",
    f"CN=cs102, OU=groups, {BASE}": ["cs102"],  # DNs match whatever their case and spacing
    "employeeType": {"faculty": "faculty"},
}
BACKENDS = [
    "accounts.lockout.LockoutBackend",
    "accounts.signon.LocalBackend",
    "accounts.signon.DirectoryBackend",
]


@pytest.fixture(scope="module")
def directory():
    missing = missing_tools()
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: apt-get install slapd ldap-utils (make install-dev does)")
    server = Directory().start()
    yield server
    server.stop()


def search_env(directory, **extra):
    return {
        "AUTH_LDAP_SERVER_URI": directory.uri,
        "AUTH_LDAP_BIND_DN": f"cn=reader,{BASE}",
        "AUTH_LDAP_BIND_PASSWORD": "reader-secret",
        "AUTH_LDAP_USER_SEARCH_BASEDN": PEOPLE,
        "AUTH_LDAP_USER_SEARCH_FILTER": "(uid=%(user)s)",
        "AUTH_LDAP_GROUP_SEARCH_BASEDN": GROUPS,
        "AUTH_LDAP_GROUP_TYPE": "groupOfNames",
        "AUTH_LDAP_GROUP_MAP": json.dumps(GROUP_MAP),
        "AUTH_LDAP_TIMEOUT": "2",
        **extra,
    }


@pytest.fixture
def use_ldap(settings, directory):
    def apply(environ):
        for name, value in ldap_settings(Env(environ)).items():
            setattr(settings, name, value)
        settings.AUTHENTICATION_BACKENDS = BACKENDS

    apply(search_env(directory))
    return apply


def sign_in(username, password, client=None):
    client = client or Client()
    response = client.post("/login/", {"username": username, "password": password})
    return client, response


def signed_in_as(client):
    user_id = client.session.get("_auth_user_id")
    return User.objects.get(pk=user_id) if user_id else None


def test_the_login_page_offers_the_campus_account(use_ldap):
    assert "Sign in with your campus account" in Client().get("/login/").content.decode()


def test_without_a_server_uri_ldap_is_off(settings):
    assert ldap_settings(Env({})) == {}
    assert "Sign in with your campus account" not in Client().get("/login/").content.decode()
    assert not any("Directory" in path for path in settings.AUTHENTICATION_BACKENDS)


def test_first_login_creates_the_user_with_mapped_groups_and_attributes(use_ldap):
    client, response = sign_in("ada", "ada-pass-1")

    assert response.status_code == 302
    user = signed_in_as(client)
    assert (user.first_name, user.last_name, user.email) == ("Ada", "Lovelace", "ada@campus.example")
    assert not user.has_usable_password()
    # "unmapped" is a directory group the map does not name: not mirrored.
    assert set(user.groups.values_list("name", flat=True)) == {"cs101"}


def test_an_attribute_value_maps_to_a_group_too(use_ldap):
    client, _ = sign_in("grace", "grace-pass-1")
    assert set(signed_in_as(client).groups.values_list("name", flat=True)) == {"cs102", "faculty"}


def test_direct_bind_with_a_dn_template(use_ldap, directory):
    environ = search_env(directory, AUTH_LDAP_USER_DN_TEMPLATE=f"uid=%(user)s,{PEOPLE}")
    del environ["AUTH_LDAP_USER_SEARCH_BASEDN"]
    use_ldap(environ)

    client, response = sign_in("grace", "grace-pass-1")

    assert response.status_code == 302
    assert signed_in_as(client).email == "grace@campus.example"


@pytest.mark.parametrize("username,password", [("ada", "wrong"), ("nobody", "ada-pass-1"), ("ada", "")])
def test_it_refuses_a_wrong_password_and_an_unknown_user(use_ldap, username, password):
    client, response = sign_in(username, password)

    assert response.status_code == 200
    assert "match. Please try again." in response.content.decode()
    assert signed_in_as(client) is None
    assert not User.objects.filter(username=username).exists()


def test_a_group_change_in_the_directory_changes_images_and_quotas_at_the_next_login(use_ldap, directory):
    cs101_only = Image.objects.create(name="cs101-matlab", visibility=Image.Visibility.RESTRICTED)
    cs102_only = Image.objects.create(name="cs102-rstudio", visibility=Image.Visibility.RESTRICTED)
    public = Image.objects.create(name="debian")
    cs101_only.groups.add(Group.objects.create(name="cs101"))
    cs102 = Group.objects.create(name="cs102")
    cs102_only.groups.add(cs102)
    QuotaRule.objects.create(name="cs102 short", group=cs102, max_duration_minutes=30)
    local = Group.objects.create(name="given-by-hand")

    client, _ = sign_in("linus", "linus-pass-1")
    linus = signed_in_as(client)
    linus.groups.add(local)
    assert set(Image.objects.visible_to(linus)) == {cs101_only, public}
    assert quotas.limits_for(linus, public).max_minutes != 30

    directory.modify(
        f"dn: cn=cs101,{GROUPS}\nchangetype: modify\ndelete: member\nmember: uid=linus,{PEOPLE}\n\n"
        f"dn: cn=cs102,{GROUPS}\nchangetype: modify\nadd: member\nmember: uid=linus,{PEOPLE}\n"
    )
    sign_in("linus", "linus-pass-1")

    linus = User.objects.get(pk=linus.pk)
    assert set(Image.objects.visible_to(linus)) == {cs102_only, public}
    assert quotas.limits_for(linus, public).max_minutes == 30
    assert set(linus.groups.values_list("name", flat=True)) == {"cs102", "given-by-hand"}


@pytest.fixture
def emmy_gone(directory):
    """Emmy's entry deleted from the directory (put back afterwards: the directory is the module's)."""
    directory.modify(f"dn: uid=emmy,{PEOPLE}\nchangetype: delete\n")
    yield
    directory.modify(
        f"dn: uid=emmy,{PEOPLE}\nchangetype: add\nobjectClass: inetOrgPerson\nuid: emmy\ncn: Emmy Noether\n"
        "givenName: Emmy\nsn: Noether\nmail: emmy@campus.example\nuserPassword: emmy-pass-1\n"
    )


@pytest.mark.parametrize("username", ["saml-made@uni.example", "oidc-made", "emmy"])
def test_a_failed_sign_in_by_a_stranger_changes_no_account(use_ldap, request, username):
    # Accounts the directory does not hold: made by SAML or OpenID Connect (no usable
    # password, staff too), or the directory's own whose entry is gone.
    if username == "emmy":
        sign_in("emmy", "emmy-pass-1")
        made = User.objects.get(username="emmy")
        request.getfixturevalue("emmy_gone")
    else:
        made = User.objects.create_user(username, is_staff=True)
    before = User.objects.filter(pk=made.pk).values().get()

    client, response = sign_in(username, "a-guess")

    assert response.status_code == 200 and signed_in_as(client) is None
    assert User.objects.filter(pk=made.pk).values().get() == before


def test_the_sweep_retires_a_directory_account_gone_from_the_directory(use_ldap, request):
    client, _ = sign_in("emmy", "emmy-pass-1")
    emmy = signed_in_as(client)
    _, token = tokens.issue(emmy, "laptop")
    request.getfixturevalue("emmy_gone")
    assert signed_in_as(sign_in("emmy", "emmy-pass-1")[0]) is None

    out = StringIO()
    call_command("ldap_retire", stdout=out)

    # Her account stays (history, reservations) but is deactivated: her earlier session and
    # her API token stop working too. Accounts other methods made are not the directory's.
    assert out.getvalue().strip() == "retired 1: emmy"
    assert User.objects.filter(username="emmy", is_active=False).exists()
    assert client.get("/").status_code == 302
    assert tokens.resolve(token) is None
    assert ObjectChange.objects.filter(object_repr="emmy", reason="no longer in the directory").exists()


def test_the_sweep_leaves_accounts_the_directory_did_not_make(use_ldap, admin_user):
    for method, name in [("saml", "sam@uni.example"), ("oidc", "olga")]:
        user = User.objects.create_user(name, is_staff=True)
        SignOnIdentity.objects.create(user=user, method=method, issuer="https://idp.example", subject=name)
    User.objects.create_user("made-before-origins")  # no usable password, no recorded origin
    sign_in("ada", "ada-pass-1")

    assert signon.retire_gone() == []
    assert User.objects.filter(is_active=False).count() == 0


@pytest.mark.parametrize("broken", ["base", "server"])
def test_the_sweep_retires_nobody_when_the_directory_does_not_answer_properly(use_ldap, directory, broken):
    sign_in("ada", "ada-pass-1")
    if broken == "base":  # a search base that does not exist: every search would find nobody
        use_ldap(search_env(directory, AUTH_LDAP_USER_SEARCH_BASEDN=f"ou=gone,{BASE}"))
    else:
        use_ldap(search_env(directory, AUTH_LDAP_SERVER_URI=f"ldap://127.0.0.1:{_closed_port()}"))

    with pytest.raises(CommandError, match="did not answer properly"):
        call_command("ldap_retire")
    assert User.objects.get(username="ada").is_active


def test_the_sweep_can_be_scheduled(db):
    from django_q.models import Schedule

    call_command("ldap_retire", "--every", "60", stdout=StringIO())
    assert Schedule.objects.get(func="accounts.signon.retire_gone").minutes == 60
    call_command("ldap_retire", "--every", "0", stdout=StringIO())
    assert not Schedule.objects.filter(func="accounts.signon.retire_gone").exists()


@pytest.mark.parametrize("method", ["saml", "oidc"])
def test_a_directory_account_never_takes_over_one_another_method_made(use_ldap, method):
    grace = User.objects.create_user("grace")
    SignOnIdentity.objects.create(user=grace, method=method, issuer="https://idp.example", subject="grace")

    client, _ = sign_in("grace", "grace-pass-1")

    assert signed_in_as(client) is None
    assert not grace.signon_identities.filter(method="ldap").exists()


def test_a_directory_account_linked_to_another_method_still_signs_in(use_ldap):
    ada = signed_in_as(sign_in("ada", "ada-pass-1")[0])
    # OIDC_LINK_VERIFIED_EMAIL bound a provider's subject to it too.
    SignOnIdentity.objects.create(user=ada, method="oidc", issuer="https://op.example", subject="17")

    assert signed_in_as(sign_in("ada", "ada-pass-1")[0]) == ada


def test_a_directory_account_made_before_origins_were_recorded_is_claimed(use_ldap):
    ada = User.objects.create_user("ada")  # no usable password: made by the directory, unrecorded

    assert signed_in_as(sign_in("ada", "ada-pass-1")[0]) == ada
    assert ada.signon_identities.get().method == "ldap"


def test_a_wrong_password_does_not_deactivate_anyone(use_ldap):
    sign_in("linus", "linus-pass-1")
    sign_in("linus", "not-his-password")
    assert User.objects.get(username="linus").is_active
    assert signed_in_as(sign_in("linus", "linus-pass-1")[0]).username == "linus"


def test_a_directory_group_mapped_onto_a_role_gives_and_takes_the_role(use_ldap, directory):
    from accounts import access

    access.ensure_roles()
    role_map = {**GROUP_MAP, f"cn=cs102,{GROUPS}": "operator"}
    use_ldap({**search_env(directory), "AUTH_LDAP_GROUP_MAP": json.dumps(role_map)})
    directory.modify(f"dn: cn=cs102,{GROUPS}\nchangetype: modify\nadd: member\nmember: uid=ada,{PEOPLE}\n")
    client, _ = sign_in("ada", "ada-pass-1")
    ada = signed_in_as(client)
    assert access.roles(ada) == ["operator"] and client.get("/inventory/").status_code == 200

    directory.modify(f"dn: cn=cs102,{GROUPS}\nchangetype: modify\ndelete: member\nmember: uid=ada,{PEOPLE}\n")
    client, _ = sign_in("ada", "ada-pass-1")
    assert access.roles(User.objects.get(pk=ada.pk)) == []
    assert client.get("/inventory/").status_code == 403


def test_a_directory_account_never_takes_over_a_local_account(use_ldap, admin_user):
    # The directory has its own uid=admin with another password.
    client, response = sign_in("admin", "directory-admin-pass")

    assert signed_in_as(client) is None
    assert sign_in("admin", "admin-pass-1")[1].status_code == 302


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def silent_directory():
    """A port that accepts connections and never answers (a hung directory)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"ldap://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("kind", ["refused", "silent"])
def test_a_directory_that_does_not_answer_is_said_so_and_the_admin_still_signs_in(
    use_ldap, directory, admin_user, kind, request
):
    uri = f"ldap://127.0.0.1:{_closed_port()}" if kind == "refused" else request.getfixturevalue("silent_directory")
    use_ldap(search_env(directory, AUTH_LDAP_SERVER_URI=uri, AUTH_LDAP_TIMEOUT="0.5"))

    client, response = sign_in("ada", "ada-pass-1")

    assert response.status_code == 200
    assert "campus directory is not answering" in response.content.decode()
    assert signed_in_as(client) is None
    client, response = sign_in("admin", "admin-pass-1")
    assert response.status_code == 302
    assert signed_in_as(client) == admin_user


def test_the_lockout_counts_ldap_failures(use_ldap, settings):
    client = Client()
    for n in range(settings.AXES_FAILURE_LIMIT):
        sign_in("grace", f"wrong-{n}", client)

    _, response = sign_in("grace", "grace-pass-1", client)

    assert response.status_code == 429
    assert not User.objects.filter(username="grace").exists()


def test_local_login_for_staff_only(use_ldap, settings, admin_user, alice):
    settings.AUTHENTICATION_BACKENDS = [
        b.replace("accounts.signon.LocalBackend", "accounts.signon.StaffOnlyModelBackend") for b in BACKENDS
    ]

    assert signed_in_as(sign_in("alice", "alice-pass-1")[0]) is None
    assert signed_in_as(sign_in("admin", "admin-pass-1")[0]) == admin_user
    assert signed_in_as(sign_in("grace", "grace-pass-1")[0]).username == "grace"


def test_the_staff_only_setting_swaps_the_local_backend(monkeypatch):
    import importlib

    import vclmgr.settings as module

    monkeypatch.setenv("LOCAL_LOGIN_STAFF_ONLY", "1")
    try:
        reloaded = importlib.reload(module)
        assert "accounts.signon.StaffOnlyModelBackend" in reloaded.AUTHENTICATION_BACKENDS
        assert "accounts.signon.LocalBackend" not in reloaded.AUTHENTICATION_BACKENDS
    finally:
        monkeypatch.delenv("LOCAL_LOGIN_STAFF_ONLY")
        importlib.reload(module)


def test_the_admin_login_and_the_rapi_basic_auth_use_the_directory(use_ldap):
    credentials = base64.b64encode(b"grace:grace-pass-1").decode()
    assert Client().get("/2/info", HTTP_AUTHORIZATION=f"Basic {credentials}").status_code == 200
    wrong = base64.b64encode(b"grace:nope").decode()
    assert Client().get("/2/info", HTTP_AUTHORIZATION=f"Basic {wrong}").status_code == 401

    # grace is not staff: the admin refuses her, with the admin's own message.
    response = Client().post("/admin/login/", {"username": "grace", "password": "grace-pass-1"})
    assert response.status_code == 200
    assert "_auth_user_id" not in response.wsgi_request.session


def test_a_deactivated_directory_user_is_refused_and_their_session_ends(use_ldap):
    client, _ = sign_in("grace", "grace-pass-1")
    User.objects.filter(username="grace").update(is_active=False)

    assert client.get("/").status_code == 302  # back to the login page
    assert signed_in_as(sign_in("grace", "grace-pass-1")[0]) is None


@pytest.mark.parametrize(
    "environ,message",
    [
        ({"AUTH_LDAP_SERVER_URI": "http://x"}, "not an ldap://"),
        ({"AUTH_LDAP_SERVER_URI": "ldap://x"}, "AUTH_LDAP_USER_DN_TEMPLATE"),
        ({"AUTH_LDAP_USER_DN_TEMPLATE": "uid=x"}, "%(user)s"),
        ({"AUTH_LDAP_GROUP_TYPE": "wheel"}, "AUTH_LDAP_GROUP_TYPE"),
        ({"AUTH_LDAP_GROUP_MAP": '{"not a dn": "x"}'}, "not a group DN"),
        ({"AUTH_LDAP_GROUP_MAP": '{"cn=a,dc=b": ""}'}, "group name"),
        ({"AUTH_LDAP_GROUP_MAP": '{"cn=a": {"v": "x"}}'}, "not an attribute name"),
        ({"AUTH_LDAP_ATTR_MAP": '{"is_staff": "x"}'}, "unknown user fields"),
        ({"AUTH_LDAP_GROUP_SEARCH_BASEDN": ""}, "set AUTH_LDAP_GROUP_SEARCH_BASEDN"),
        ({"AUTH_LDAP_TIMEOUT": "soon"}, "AUTH_LDAP_TIMEOUT"),
    ],
)
def test_bad_settings_stop_the_start_with_the_variable_named(environ, message):
    from django.core.exceptions import ImproperlyConfigured

    base = {
        "AUTH_LDAP_SERVER_URI": "ldap://127.0.0.1:1",
        "AUTH_LDAP_USER_SEARCH_BASEDN": PEOPLE,
        "AUTH_LDAP_GROUP_SEARCH_BASEDN": GROUPS,
        "AUTH_LDAP_GROUP_MAP": json.dumps(GROUP_MAP),
    }
    environ = {**base, **environ}
    if "AUTH_LDAP_SERVER_URI" in environ and environ["AUTH_LDAP_SERVER_URI"] == "ldap://x":
        del environ["AUTH_LDAP_USER_SEARCH_BASEDN"]
    with pytest.raises(ImproperlyConfigured, match=message.replace("(", r"\(").replace(")", r"\)")):
        ldap_settings(Env(environ))


def test_the_bind_password_may_come_from_a_file(tmp_path):
    secret = tmp_path / "bind"
    secret.write_text("s3cret\n")
    environ = {
        "AUTH_LDAP_SERVER_URI": "ldaps://ldap.campus.example",
        "AUTH_LDAP_USER_DN_TEMPLATE": "uid=%(user)s,o=x",
        "AUTH_LDAP_BIND_PASSWORD_FILE": str(secret),
        "AUTH_LDAP_START_TLS": "no",
        "AUTH_LDAP_CA_FILE": "/etc/ca.pem",
    }
    got = ldap_settings(Env(environ))
    assert got["AUTH_LDAP_BIND_PASSWORD"] == "s3cret"  # noqa: S105
    import ldap

    assert got["AUTH_LDAP_CONNECTION_OPTIONS"][ldap.OPT_X_TLS_CACERTFILE] == "/etc/ca.pem"
    assert list(got["AUTH_LDAP_CONNECTION_OPTIONS"])[-1] == ldap.OPT_X_TLS_NEWCTX


@pytest.mark.parametrize("how", ["start_tls", "ldaps"])
def test_it_signs_in_over_tls_checking_the_servers_certificate(use_ldap, directory, how):
    tls = {"AUTH_LDAP_START_TLS": "1"} if how == "start_tls" else {"AUTH_LDAP_SERVER_URI": directory.ldaps_uri}
    use_ldap(search_env(directory, AUTH_LDAP_CA_FILE=str(directory.ca_file), **tls))
    client, response = sign_in("grace", "grace-pass-1")
    assert response.status_code == 302

    # The same server checked against CAs that did not sign its certificate: refused.
    use_ldap(search_env(directory, AUTH_LDAP_CA_FILE="/etc/ssl/certs/ca-certificates.crt", **tls))
    client, response = sign_in("ada", "ada-pass-1")
    assert response.status_code == 200
    assert signed_in_as(client) is None


def test_a_server_uri_in_the_environment_turns_the_directory_backend_on(monkeypatch, directory):
    import importlib

    import vclmgr.settings as module

    for name, value in search_env(directory).items():
        monkeypatch.setenv(name, value)
    try:
        reloaded = importlib.reload(module)
        backends = reloaded.AUTHENTICATION_BACKENDS
        # After the local accounts: the admin signs in at once while the directory is down.
        assert backends.index("accounts.signon.DirectoryBackend") > backends.index("accounts.signon.LocalBackend")
        assert reloaded.AUTH_LDAP_USER_SEARCH.base_dn == PEOPLE
    finally:
        monkeypatch.undo()
        importlib.reload(module)
