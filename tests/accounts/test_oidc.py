"""Sign-on through OpenID Connect: the real flow, from vclmgr's daphne to a real
provider (django-oauth-toolkit, tests/oidc_provider.py) and back, in a requests session that
follows the redirects and posts the provider's login form."""

import html
import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import pytest
import requests
from axes.models import AccessAttempt
from cryptography.hazmat.primitives import serialization
from django.contrib.auth.models import Group, User
from jwt.algorithms import RSAAlgorithm

from provisioning.models import Image
from tests import oidc_provider, processes, web
from tests.oidc_provider import Provider, rsa_pem, start_vclmgr
from tests.processes import committed_db, committed_db_too

provider, vclmgr, vclmgr_process = oidc_provider.provider, oidc_provider.shared_vclmgr, oidc_provider.vclmgr_process
transactional_db, db = committed_db, committed_db_too  # a process shared by the tests: see committed_db


def to_callback(base_url, username, password, start=None):
    """The flow up to the provider's redirect back: returns the session and vclmgr's callback URL
    (with the code and state), not yet visited. ``start``: the sign-in's first path, else the
    login page's button."""
    session = requests.Session()
    if start is None:
        start = web.sign_on_start(session, base_url, "/oidc/authenticate/", "Campus ID")
    form = session.get(base_url + start, timeout=30)
    assert "/accounts/login/" in form.url, form.url  # at the provider now
    fields = dict(re.findall(r'name="(csrfmiddlewaretoken|next)" value="([^"]*)"', form.text))
    fields = {k: html.unescape(v) for k, v in fields.items()}
    data = {**fields, "username": username, "password": password}
    answer = session.post(form.url, data=data, allow_redirects=False, timeout=30)
    while answer.is_redirect and "/oidc/callback/" not in answer.headers["Location"]:
        answer = session.get(urljoin(answer.url, answer.headers["Location"]), allow_redirects=False, timeout=30)
    assert answer.is_redirect, answer.text
    return session, urljoin(answer.url, answer.headers["Location"])


def sign_in(base_url, username, password):
    """The whole flow; returns the session and the last answer (after every redirect)."""
    session, callback = to_callback(base_url, username, password)
    return session, session.get(callback, timeout=30)


def visible_images(session, base_url):
    answer = session.get(f"{base_url}/api/v1/images/", timeout=30)
    assert answer.status_code == 200, answer.text
    return sorted(image["name"] for image in answer.json()["results"])


@pytest.fixture
def images(transactional_db):
    Image.objects.create(name="public")
    for name in ("cs101", "cs102"):
        image = Image.objects.create(name=f"{name}-matlab", visibility=Image.Visibility.RESTRICTED)
        image.groups.add(Group.objects.get_or_create(name=name)[0])


def test_first_sign_in_creates_the_user_with_the_mapped_groups(vclmgr, provider, images):
    session, answer = sign_in(vclmgr.url, "ann", "ann-pass")

    assert answer.url == f"{vclmgr.url}/", answer.url
    ann = User.objects.get(username="ann")
    assert (ann.email, ann.first_name, ann.has_usable_password()) == ("ann@uni.example", "Ann", False)
    assert sorted(ann.groups.values_list("name", flat=True)) == ["cs101"]
    assert visible_images(session, vclmgr.url) == ["cs101-matlab", "public"]


def test_a_group_change_at_the_provider_applies_at_the_next_sign_in(vclmgr, provider, images):
    sign_in(vclmgr.url, "ann", "ann-pass")
    hand_given = Group.objects.create(name="lab-helpers")
    User.objects.get(username="ann").groups.add(hand_given)
    provider.user("ann", "ann-pass", email="ann@uni.example", groups=["cs102-students", "unmapped"])
    try:
        session, answer = sign_in(vclmgr.url, "ann", "ann-pass")

        assert answer.url == f"{vclmgr.url}/"
        assert visible_images(session, vclmgr.url) == ["cs102-matlab", "public"]
        # Groups outside OIDC_GROUP_MAP are not the provider's to take away.
        assert sorted(User.objects.get(username="ann").groups.values_list("name", flat=True)) == [
            "cs102",
            "lab-helpers",
        ]
    finally:
        provider.user("ann", "ann-pass", email="ann@uni.example", groups=["cs101-students"], first_name="Ann")


@pytest.mark.parametrize(
    ("username", "logged"),
    [
        ("mallory-aud", "ID token for another audience"),
        ("mallory-nonce", "JWT Nonce verification failed"),
        ("mallory-sub", "about another subject than the ID token"),
        ("mallory-iss", "ID token from another issuer: 'https://another-issuer.example/o'"),
        ("mallory-exp", "ID token refused: Signature has expired"),
    ],
)
def test_it_refuses_a_token_for_another_audience_nonce_subject_issuer_or_time(vclmgr, provider, username, logged):
    session, answer = sign_in(vclmgr.url, username, "pw")

    assert answer.url.startswith(f"{vclmgr.url}/login/"), answer.url
    assert "Sign-in with Campus ID failed" in answer.text
    assert not User.objects.filter(username=username).exists()
    assert logged in vclmgr.output()
    assert session.get(f"{vclmgr.url}/api/v1/images/", timeout=30).status_code in {401, 403}


def test_an_issuer_set_in_the_environment_is_the_one_id_tokens_must_carry(transactional_db, tmp_path, provider):
    child = start_vclmgr(tmp_path, provider, OIDC_OP_ISSUER="https://campus-realm.example/o")
    try:
        _, answer = sign_in(child.url, "ann", "ann-pass")

        assert answer.url.startswith(f"{child.url}/login/"), answer.url
        assert not User.objects.filter(username="ann").exists()
        assert "ID token from another issuer" in child.output()
    finally:
        child.kill()


@pytest.mark.parametrize("where", ["the same session", "another session", "another session's own sign-in"])
def test_it_refuses_a_replayed_callback(vclmgr, provider, where):
    session, callback = to_callback(vclmgr.url, "ann", "ann-pass")
    assert session.get(callback, timeout=30).url == f"{vclmgr.url}/"  # its one use signs ann in
    replayer = session if where == "the same session" else requests.Session()
    logged = "not an answer to a sign-in this session started"
    if where == "another session's own sign-in":
        # The code with the state of a sign-in this session did start: vclmgr takes the state,
        # the provider refuses the code (used once already, and not this PKCE verifier's).
        start = replayer.get(f"{vclmgr.url}/oidc/authenticate/", allow_redirects=False, timeout=30)
        state = parse_qs(urlsplit(start.headers["Location"]).query)["state"][0]
        code = parse_qs(urlsplit(callback).query)["code"][0]
        callback = f"{vclmgr.url}/oidc/callback/?{urlencode({'code': code, 'state': state})}"
        logged = "refused by the provider"

    answer = replayer.get(callback, timeout=30)

    assert answer.status_code == 200, answer.status_code
    assert logged in vclmgr.output()
    if where == "the same session":  # still signed in from the first use, and nothing more
        assert answer.url == f"{vclmgr.url}/"
    else:
        assert answer.url.startswith(f"{vclmgr.url}/login/")
        assert "Sign-in with Campus ID failed" in answer.text
        assert replayer.get(f"{vclmgr.url}/api/v1/images/", timeout=30).status_code in {401, 403}


@pytest.mark.parametrize("how", ["refuses connections", "is silent"])
def test_a_provider_that_does_not_answer_is_a_message_on_the_login_page(
    transactional_db, tmp_path, provider, alice, how
):
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    if how == "is silent":
        dead.listen(8)  # connections are taken, never answered
    url = f"http://127.0.0.1:{dead.getsockname()[1]}/o/.well-known/openid-configuration"
    child = start_vclmgr(tmp_path, provider, OIDC_OP_DISCOVERY_URL=url, OIDC_TIMEOUT="1")
    try:
        session = requests.Session()
        start = web.sign_on_start(session, child.url, "/oidc/authenticate/", "Campus ID")

        answer = session.get(child.url + start, timeout=30)

        assert answer.status_code == 200 and answer.url.startswith(f"{child.url}/login/"), answer.url
        assert "Campus ID does not answer; try again later." in answer.text
        assert f"cannot read {url}" in child.output()
        _, local = web.local_sign_in(child.url, "alice", "alice-pass-1")
        assert local.url == f"{child.url}/"
    finally:
        child.kill()
        dead.close()


def test_a_provider_that_stops_answering_during_a_sign_in_is_a_message_on_the_login_page(
    transactional_db, tmp_path, alice
):
    # A provider of its own: this one is stopped between its redirect back and the code's exchange.
    idp = Provider(tmp_path / "idp")
    child = None
    try:
        idp.user("ann", "ann-pass", email="ann@uni.example", groups=["cs101-students"])
        child = start_vclmgr(tmp_path, idp, OIDC_TIMEOUT="2")
        session, callback = to_callback(child.url, "ann", "ann-pass")
        idp.stop()

        answer = session.get(callback, timeout=30)

        assert answer.status_code == 200 and answer.url.startswith(f"{child.url}/login/"), answer.url
        assert "Campus ID does not answer; try again later." in answer.text
        assert "the provider did not answer" in child.output()
        assert not User.objects.filter(username="ann").exists()
        _, local = web.local_sign_in(child.url, "alice", "alice-pass-1")
        assert local.url == f"{child.url}/"
    finally:
        if child is not None:
            child.kill()
        if idp.child.alive():
            idp.stop()


class _ForgedJwks(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def test_it_refuses_a_token_whose_signature_does_not_verify(transactional_db, tmp_path, provider):
    # The provider's own key id, another key: the signature must be checked, not only the kid.
    real = requests.get(f"{provider.url}/o/.well-known/jwks.json", timeout=30).json()["keys"][0]
    other_key = serialization.load_pem_private_key(rsa_pem().encode(), password=None).public_key()
    other = json.loads(RSAAlgorithm.to_jwk(other_key))
    _ForgedJwks.body = json.dumps({"keys": [{**other, "kid": real["kid"], "alg": "RS256", "use": "sig"}]}).encode()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ForgedJwks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    child = start_vclmgr(tmp_path, provider, OIDC_OP_JWKS_ENDPOINT=f"http://127.0.0.1:{server.server_port}/jwks")
    try:
        _, answer = sign_in(child.url, "ann", "ann-pass")

        assert answer.url.startswith(f"{child.url}/login/")
        assert not User.objects.filter(username="ann").exists()
        assert "JWS token verification failed" in child.output()
    finally:
        child.kill()
        server.shutdown()


@pytest.mark.parametrize("elsewhere", ["https://evil.example/", "//evil.example/", "/\\evil.example/"])
def test_the_way_back_never_leaves_the_site(vclmgr, provider, elsewhere):
    session, callback = to_callback(
        vclmgr.url, "ann", "ann-pass", start=f"/oidc/authenticate/?{urlencode({'next': elsewhere})}"
    )

    answer = session.get(callback, allow_redirects=False, timeout=30)  # never toward the other site

    assert answer.status_code == 302
    assert answer.headers["Location"] == "/"


def test_a_local_account_is_not_taken_over(vclmgr, provider, django_user_model):
    local = django_user_model.objects.create_user("Ann", "ann@uni.example", password="local-pass-1")  # noqa: S106

    session, answer = sign_in(vclmgr.url, "ann", "ann-pass")

    assert answer.url == f"{vclmgr.url}/"
    assert signed_in_as(session).username == "ann-2"
    assert "the username ann is taken, the new account is ann-2" in vclmgr.output()
    assert web.local_sign_in(vclmgr.url, "Ann", "local-pass-1")[1].url == f"{vclmgr.url}/"
    assert not local.signon_identities.exists()


def test_local_sign_in_keeps_working(vclmgr, alice):
    _, answer = web.local_sign_in(vclmgr.url, "alice", "alice-pass-1")
    assert answer.url == f"{vclmgr.url}/"


def test_it_refuses_to_start_without_a_way_to_find_the_endpoints():
    env = {"OIDC_RP_CLIENT_ID": "vclmgr", "OIDC_RP_CLIENT_SECRET": "x", "OIDC_OP_TOKEN_ENDPOINT": "https://op/t"}
    done = processes.settings_child("import django; django.setup()", **env)
    assert done.returncode != 0
    assert (
        "set OIDC_OP_DISCOVERY_URL or OIDC_OP_ISSUER, OIDC_OP_AUTHORIZATION_ENDPOINT, OIDC_OP_USER_ENDPOINT, "
        "OIDC_OP_JWKS_ENDPOINT" in (done.stderr)
    )


def test_refused_sign_ons_do_not_lock_the_address_out_of_sign_on(vclmgr, provider):
    # What axes records for a refused callback (no username) past the limit, from this address.
    AccessAttempt.objects.create(
        username=None, ip_address="127.0.0.1", user_agent="", failures_since_start=50, get_data="", post_data=""
    )

    _, answer = sign_in(vclmgr.url, "ann", "ann-pass")

    assert answer.url == f"{vclmgr.url}/"


def test_it_is_off_by_default(client, db):
    assert "Sign in with" not in client.get("/login/").content.decode()
    assert client.get("/oidc/authenticate/").status_code == 404


def signed_in_as(session):
    from django.contrib.sessions.models import Session

    key = session.cookies.get("sessionid")
    found = Session.objects.filter(pk=key).first() if key else None
    user_id = found.get_decoded().get("_auth_user_id") if found else None
    return User.objects.get(pk=user_id) if user_id else None


def test_a_provider_user_of_the_same_name_gets_an_account_of_its_own(vclmgr, provider, django_user_model):
    # An account LDAP (or SAML) made: no usable password, the directory's groups.
    ada = django_user_model.objects.create_user("ada", email="ada@campus.example")
    ada.set_unusable_password()
    ada.save()
    ada.groups.add(Group.objects.create(name="faculty"))
    provider.user("ada", "not-the-same-ada", email="ada@elsewhere.example", groups=["cs101-students"])

    session, answer = sign_in(vclmgr.url, "ada", "not-the-same-ada")

    assert answer.url == f"{vclmgr.url}/", answer.url
    other = django_user_model.objects.get(email="ada@elsewhere.example")
    assert other.pk != ada.pk and other.username.lower() != "ada"
    assert signed_in_as(session) == other
    ada.refresh_from_db()
    assert (ada.email, sorted(ada.groups.values_list("name", flat=True))) == ("ada@campus.example", ["faculty"])
    # The next sign-in of the same subject is the same account, not a third one.
    sign_in(vclmgr.url, "ada", "not-the-same-ada")
    assert django_user_model.objects.filter(username__istartswith="ada").count() == 2


@pytest.fixture(scope="module")
def linking_process(django_db_setup, tmp_path_factory, provider):
    child = start_vclmgr(tmp_path_factory.mktemp("linking"), provider, OIDC_LINK_VERIFIED_EMAIL="1")
    yield child
    child.kill()


@pytest.fixture
def linking(transactional_db, linking_process):
    return linking_process.begin()


def made_by_ldap(django_user_model, username, email):
    from accounts.models import SignOnIdentity

    user = django_user_model.objects.create_user(username, email)
    SignOnIdentity.objects.create(user=user, method="ldap", issuer="ldap", subject=username)
    return user


@pytest.mark.parametrize("verified", [True, False])
def test_a_verified_email_links_an_existing_account_only_when_allowed(linking, provider, django_user_model, verified):
    ann = made_by_ldap(django_user_model, "ann.lee", "ann@uni.example")
    groups = ["cs101-students"] + ([] if verified else ["unverified-email"])
    provider.user("ann", "ann-pass", email="ann@uni.example", groups=groups, first_name="Ann")
    try:
        session, answer = sign_in(linking.url, "ann", "ann-pass")
    finally:
        provider.user("ann", "ann-pass", email="ann@uni.example", groups=["cs101-students"], first_name="Ann")

    assert answer.url == f"{linking.url}/"
    assert (signed_in_as(session) == ann) is verified
    assert ann.signon_identities.filter(method="oidc").exists() is verified


def test_without_the_setting_a_verified_email_links_nothing(vclmgr, provider, django_user_model):
    ann = made_by_ldap(django_user_model, "ann.lee", "ann@uni.example")

    session, _ = sign_in(vclmgr.url, "ann", "ann-pass")

    assert signed_in_as(session).username == "ann" and signed_in_as(session) != ann


def test_a_verified_email_never_links_a_local_account(linking, provider, django_user_model):
    local = django_user_model.objects.create_user("ann.lee", "ann@uni.example", password="local-pass-1")  # noqa: S106

    session, _ = sign_in(linking.url, "ann", "ann-pass")

    assert signed_in_as(session) != local
    assert "has ann@uni.example, not linked (a local account)" in linking.output()
