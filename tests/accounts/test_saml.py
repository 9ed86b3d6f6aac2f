"""Sign-on through SAML 2.0: the real flow, from vclmgr's daphne to a real IdP
(pysaml2's, tests/saml_idp.py) by the HTTP-Redirect binding and back by HTTP-POST, in a
requests session that posts the IdP's login form and its auto-submitting answer."""

import html
import re
from urllib.parse import urlencode

import pytest
import requests
from django.contrib.auth.models import Group, User

from provisioning.models import Image
from tests import processes, saml_idp, web
from tests.processes import committed_db, committed_db_too, free_port
from tests.saml_idp import start_vclmgr

idp, sp_keys, vclmgr, vclmgr_process = saml_idp.idp, saml_idp.sp_keys, saml_idp.shared_vclmgr, saml_idp.vclmgr_process
transactional_db, db = committed_db, committed_db_too  # a process shared by the tests: see committed_db


def hidden_fields(page):
    return {k: html.unescape(v) for k, v in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page)}


def to_idp(session, base_url, start=None):
    """vclmgr's login page → its button (or ``start``) → the IdP's login form (after the redirect)."""
    if start is None:
        start = web.sign_on_start(session, base_url, "/saml2/login/", "Campus SSO")
    form = session.get(base_url + start, timeout=30)
    assert "Campus sign-in" in form.text, form.text
    return form


def idp_answer(session, base_url, username, password=None, start=None):
    """Signs in at the IdP; returns the form the IdP's page would post to vclmgr's ACS."""
    form = to_idp(session, base_url, start)
    key = re.search(r'name="key" value="([^"]+)"', form.text).group(1)
    idp_url = form.url.split("/sso/")[0]
    page = session.post(
        f"{idp_url}/login",
        data={"key": key, "username": username, "password": password or f"{username}-pass"},
        timeout=30,
    )
    action = re.search(r'<form action="([^"]+)" method="post">', page.text)
    assert action, page.text
    return html.unescape(action.group(1)), hidden_fields(page.text)


def sign_in(base_url, username, password=None):
    session = requests.Session()
    action, fields = idp_answer(session, base_url, username, password)
    return session, session.post(action, data=fields, timeout=30)


def visible_images(session, base_url):
    answer = session.get(f"{base_url}/api/v1/images/", timeout=30)
    assert answer.status_code == 200, answer.text
    return sorted(image["name"] for image in answer.json()["results"])


def refused(session, answer, child):
    assert answer.url.startswith(f"{child.url}/login/"), answer.url
    assert "Sign-in with Campus SSO failed" in answer.text
    assert session.get(f"{child.url}/api/v1/images/", timeout=30).status_code in {401, 403}
    return True


@pytest.fixture
def images(transactional_db):
    Image.objects.create(name="public")
    for name in ("cs101", "cs102", "faculty"):
        image = Image.objects.create(name=f"{name}-matlab", visibility=Image.Visibility.RESTRICTED)
        image.groups.add(Group.objects.get_or_create(name=name)[0])


def test_first_sign_in_creates_the_user_with_the_mapped_groups(vclmgr, idp, images):
    session, answer = sign_in(vclmgr.url, "ann")

    assert answer.url == f"{vclmgr.url}/", answer.url
    ann = User.objects.get(username="ann@uni.example")
    assert (ann.email, ann.first_name, ann.last_name) == ("ann@uni.example", "Ann", "Student")
    assert not ann.has_usable_password()
    assert sorted(ann.groups.values_list("name", flat=True)) == ["cs101", "students"]
    assert visible_images(session, vclmgr.url) == ["cs101-matlab", "public"]


def test_a_changed_affiliation_at_the_idp_applies_at_the_next_sign_in(vclmgr, idp, images):
    sign_in(vclmgr.url, "ann")
    hand_given = Group.objects.create(name="lab-helpers")
    User.objects.get(username="ann@uni.example").groups.add(hand_given)
    idp.users["ann"] = saml_idp.student("ann@uni.example", affiliation=["faculty", "member"], courses=["cs102"])
    idp.save()
    try:
        session, answer = sign_in(vclmgr.url, "ann")

        assert answer.url == f"{vclmgr.url}/"
        assert visible_images(session, vclmgr.url) == ["cs102-matlab", "faculty-matlab", "public"]
        # Groups outside SAML_GROUP_MAP are not the IdP's to take away.
        groups = User.objects.get(username="ann@uni.example").groups.values_list("name", flat=True)
        assert sorted(groups) == ["cs102", "faculty", "lab-helpers"]
    finally:
        idp.users["ann"] = saml_idp.student("ann@uni.example")
        idp.save()


def test_idp_metadata_can_come_from_a_file(transactional_db, tmp_path, idp, sp_keys):
    child = start_vclmgr(tmp_path, idp, sp_keys, SAML_METADATA_REMOTE=None, SAML_METADATA_LOCAL=idp.metadata_file)
    try:
        _, answer = sign_in(child.url, "ann")

        assert answer.url == f"{child.url}/"
        assert User.objects.filter(username="ann@uni.example").exists()
    finally:
        child.kill()


def test_it_refuses_a_response_whose_signature_does_not_verify(vclmgr, idp):
    # Signed by the IdP, then an affiliation changed from student to faculty on the way.
    session, answer = sign_in(vclmgr.url, "mallory-sig")

    assert refused(session, answer, vclmgr)
    assert not User.objects.filter(username="mallory-sig@uni.example").exists()
    assert "SAML sign-in refused from 127.0.0.1: SignatureError" in vclmgr.output()


@pytest.mark.parametrize(
    ("mode", "logged"),
    [
        ("unsigned", "SignatureError: Signature missing for assertion"),
        ("response-only", "SignatureError: Signature missing for assertion"),
        ("rogue-key", "SignatureError: Failed to verify signature"),
        ("expired", "VerificationError: Condition not OK"),
    ],
)
def test_it_refuses_an_unsigned_wrongly_signed_or_expired_assertion(vclmgr, idp, mode, logged):
    # Unsigned; a signed response around an unsigned assertion (SAML_WANT_ASSERTIONS_SIGNED);
    # signed with a key the IdP's metadata does not name; expired (past SAML_ACCEPTED_TIME_DIFF).
    session, answer = sign_in(vclmgr.url, f"mallory-{mode}")

    assert refused(session, answer, vclmgr)
    assert not User.objects.filter(username=f"mallory-{mode}@uni.example").exists()
    assert f"SAML sign-in refused from 127.0.0.1: {logged}" in vclmgr.output()


def test_it_refuses_a_response_for_another_audience(vclmgr, idp):
    session, answer = sign_in(vclmgr.url, "mallory-aud")

    assert refused(session, answer, vclmgr)
    assert not User.objects.filter(username="mallory-aud@uni.example").exists()
    assert "AudienceRestrictions conditions not satisfied" in vclmgr.output()


def test_it_refuses_a_replayed_response(vclmgr, idp):
    session = requests.Session()
    action, fields = idp_answer(session, vclmgr.url, "ann")
    assert session.post(action, data=fields, timeout=30).url == f"{vclmgr.url}/"
    User.objects.filter(username="ann@uni.example").delete()

    # The same browser after signing out, and a stranger who captured the POST.
    session.cookies.clear()
    again = session.post(action, data=fields, timeout=30)
    stranger = requests.Session()
    replayed = stranger.post(action, data=fields, timeout=30)

    assert refused(session, again, vclmgr)
    assert refused(stranger, replayed, vclmgr)
    assert not User.objects.filter(username="ann@uni.example").exists()
    assert vclmgr.output().count("SAML sign-in refused from 127.0.0.1: UnsolicitedResponse") == 2


def test_it_refuses_a_replay_within_the_same_saml_session(vclmgr, idp):
    session = requests.Session()
    action, fields = idp_answer(session, vclmgr.url, "ann")
    assert session.post(action, data=fields, timeout=30).url == f"{vclmgr.url}/"
    session.cookies.set("sessionid", None)  # signed out of vclmgr, the SAML session kept

    again = session.post(action, data=fields, timeout=30)

    assert refused(session, again, vclmgr)
    assert "UnsolicitedResponse" in vclmgr.output()


@pytest.mark.parametrize("elsewhere", ["https://evil.example/", "//evil.example/", "/\\evil.example/"])
def test_the_way_back_never_leaves_the_site(vclmgr, idp, elsewhere):
    session = requests.Session()
    action, fields = idp_answer(session, vclmgr.url, "ann", start=f"/saml2/login/?{urlencode({'next': elsewhere})}")
    # The RelayState is not signed: whatever the IdP's page posts back, not only what was sent.
    answer = session.post(
        action, data={**fields, "RelayState": elsewhere}, allow_redirects=False, timeout=30
    )  # never toward the other site

    assert answer.status_code == 302
    assert answer.headers["Location"] == "/"


def test_a_local_account_is_not_taken_over(vclmgr, idp, django_user_model):
    django_user_model.objects.create_user("ann@uni.example", password="local-pass-1")  # noqa: S106

    session, answer = sign_in(vclmgr.url, "ann")

    assert refused(session, answer, vclmgr)
    assert "a local account has this name" in vclmgr.output()


@pytest.mark.parametrize("method", ["ldap", "oidc", "saml"])
def test_an_account_another_method_made_is_not_taken_over(vclmgr, idp, django_user_model, method):
    from accounts.models import SignOnIdentity

    # saml: another IdP of the same federation metadata, which vouched for this name first.
    made = django_user_model.objects.create_user("ann@uni.example", is_staff=True)
    SignOnIdentity.objects.create(user=made, method=method, issuer="https://other.example", subject="ann@uni.example")

    session, answer = sign_in(vclmgr.url, "ann")

    assert refused(session, answer, vclmgr)
    assert "the account belongs to" in vclmgr.output()
    assert not made.signon_identities.filter(issuer=idp.metadata_url).exists()


def test_the_account_saml_made_is_recorded_as_its_own(vclmgr, idp):
    session, _ = sign_in(vclmgr.url, "ann")
    sign_in(vclmgr.url, "ann")

    identity = User.objects.get(username="ann@uni.example").signon_identities.get()
    assert (identity.method, identity.issuer, identity.subject) == ("saml", idp.metadata_url, "ann@uni.example")


def test_sp_metadata_is_served_at_a_fixed_url(vclmgr, sp_keys):
    answer = requests.get(f"{vclmgr.url}/saml2/metadata/", timeout=30)

    assert answer.status_code == 200
    assert answer.headers["Content-Type"].startswith("text/xml")
    text = answer.text
    assert f'entityID="{vclmgr.url}/saml2/metadata/"' in text
    assert f'Location="{vclmgr.url}/saml2/acs/"' in text
    assert f'Location="{vclmgr.url}/saml2/ls/"' in text
    cert = "".join(sp_keys[1].read_text().splitlines()[1:-1])
    assert cert in text.replace("\n", "")
    assert 'use="encryption"' in text and 'use="signing"' in text
    assert "PRIVATE KEY" not in text


def test_single_logout_signs_out_at_the_idp_too(vclmgr, idp):
    session, _ = sign_in(vclmgr.url, "ann")
    home = session.get(f"{vclmgr.url}/", timeout=30)
    token = web.csrf_token(home.text)

    page = session.post(
        f"{vclmgr.url}/logout/", data={"csrfmiddlewaretoken": token}, headers={"Referer": f"{vclmgr.url}/"}, timeout=30
    )
    refresh = re.search(r'<meta http-equiv="refresh" content="0;url=([^"]+)">', page.text)
    assert refresh, page.text
    back = session.get(html.unescape(refresh.group(1)), timeout=30)  # to the IdP, and back to /saml2/ls/

    assert back.url == f"{vclmgr.url}/login/", back.url
    assert session.get(f"{vclmgr.url}/api/v1/images/", timeout=30).status_code in {401, 403}
    logout = idp.events("logout")[-1]
    assert logout["sp"] == f"{vclmgr.url}/saml2/metadata/"
    assert logout["signed"] is True
    assert "Error" not in vclmgr.output().split("SAML sign-in of ann@uni.example")[-1]


def test_a_local_sign_in_still_signs_out_locally(vclmgr, alice):
    session, home = web.local_sign_in(vclmgr.url, "alice", "alice-pass-1")
    assert home.url == f"{vclmgr.url}/"
    token = web.csrf_token(home.text)

    out = session.post(
        f"{vclmgr.url}/logout/", data={"csrfmiddlewaretoken": token}, headers={"Referer": f"{vclmgr.url}/"}, timeout=30
    )

    assert out.url == f"{vclmgr.url}/login/"
    assert session.get(f"{vclmgr.url}/api/v1/images/", timeout=30).status_code in {401, 403}


def test_an_idp_that_does_not_answer_is_a_message_not_an_error(transactional_db, tmp_path, idp, sp_keys):
    closed = f"http://127.0.0.1:{free_port()}/metadata"
    child = start_vclmgr(tmp_path, idp, sp_keys, SAML_METADATA_REMOTE=closed)
    try:
        session = requests.Session()
        answer = session.get(f"{child.url}/saml2/login/", timeout=30)

        assert answer.url == f"{child.url}/login/", answer.url
        assert "Campus SSO does not answer; try again later." in answer.text
        assert "cannot load the IdP metadata" in child.output()
        # The SP's own metadata needs no IdP.
        assert session.get(f"{child.url}/saml2/metadata/", timeout=30).status_code == 200
    finally:
        child.kill()


def test_it_is_off_by_default(client, db):
    page = client.get("/login/").content.decode()
    assert "Sign in with" not in page
    assert client.get("/saml2/metadata/").status_code == 404
    assert client.get("/saml2/login/").status_code == 404


def _start(tmp_path, sp_keys, **variables):
    key, cert = sp_keys
    env = {"SAML_BASE_URL": "https://vcl.uni.example", "SAML_KEY_FILE": str(key), "SAML_CERT_FILE": str(cert)}
    env |= {"SAML_METADATA_REMOTE": "https://idp.uni.example/idp/shibboleth", "VCLMGR_VAR_DIR": str(tmp_path)}
    env |= {k: str(v) for k, v in variables.items()}
    return processes.settings_child("import django; django.setup()", **{k: v for k, v in env.items() if v != "None"})


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"SAML_BASE_URL": None}, "SAML is on (SAML_METADATA_LOCAL/REMOTE): set SAML_BASE_URL"),
        ({"SAML_KEY_FILE": "/nonexistent/key.pem"}, "SAML_KEY_FILE: cannot read /nonexistent/key.pem"),
        ({"SAML_CERT_FILE": "{other_cert}"}, "SAML_KEY_FILE and SAML_CERT_FILE do not belong together"),
        ({"SAML_KEY_FILE": "{garbage}"}, "SAML_KEY_FILE: not an unencrypted PEM private key"),
        ({"SAML_METADATA_LOCAL": "{garbage}"}, "SAML_METADATA_LOCAL: cannot load the IdP metadata"),
        ({"SAML_METADATA_REMOTE": "ftp://idp/md"}, "SAML_METADATA_REMOTE: 'ftp://idp/md' is not an https:// URL"),
        ({"SAML_GROUP_MAP": '{"eduPersonAffiliation": "staff"}'}, "SAML_GROUP_MAP: 'eduPersonAffiliation' must map"),
        ({"SAML_ATTRIBUTE_MAPPING": '{"mail": ["email"]}'}, "SAML_ATTRIBUTE_MAPPING: no attribute gives the username"),
        ({"SAML_XMLSEC_BINARY": "/nonexistent/xmlsec1"}, "SAML needs xmlsec1 to check signatures"),
        ({"DEBUG": "0", "SECRET_KEY": "x" * 50}, "SAML_BASE_URL: use https://"),
        (
            {"SAML_WANT_ASSERTIONS_SIGNED": "no"},
            "SAML_WANT_ASSERTIONS_SIGNED and SAML_WANT_RESPONSE_SIGNED are both off",
        ),
    ],
)
def test_a_bad_configuration_stops_the_start_with_a_clear_message(tmp_path, sp_keys, variables, message):
    other_key, other_cert = saml_idp.key_pair(tmp_path, "other-", "another SP")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("<not metadata, not a key>")
    fill = {"{other_cert}": str(other_cert), "{garbage}": str(garbage)}
    if "SAML_BASE_URL" not in variables and variables.get("DEBUG") == "0":
        variables = {**variables, "SAML_BASE_URL": "http://vcl.uni.example"}

    done = _start(tmp_path, sp_keys, **{k: fill.get(v, v) for k, v in variables.items()})

    assert done.returncode != 0
    assert message in done.stderr, done.stderr[-2000:]


def test_a_good_configuration_starts(tmp_path, sp_keys):
    done = _start(tmp_path, sp_keys)

    assert done.returncode == 0, done.stderr[-2000:]


def test_a_logout_request_ends_no_local_session_and_junk_is_refused(vclmgr, alice, idp):
    # Reached by any link another site offers: djangosaml2 ended whatever session came with it.
    session, home = web.local_sign_in(vclmgr.url, "alice", "alice-pass-1")
    assert home.url == f"{vclmgr.url}/"
    saml_session, _ = sign_in(vclmgr.url, "ann")

    local = session.get(f"{vclmgr.url}/saml2/ls/?SAMLRequest=Zm9v", allow_redirects=False, timeout=30)
    junk = saml_session.get(f"{vclmgr.url}/saml2/ls/?SAMLRequest=Zm9v", allow_redirects=False, timeout=30)

    assert (local.status_code, junk.status_code) == (400, 400)
    assert session.get(f"{vclmgr.url}/api/v1/images/", timeout=30).status_code == 200
    assert saml_session.get(f"{vclmgr.url}/api/v1/images/", timeout=30).status_code == 200
    assert "SAML logout request refused from 127.0.0.1: not a session from a SAML sign-in" in vclmgr.output()
    assert "SAML logout request refused from 127.0.0.1: UnravelError" in vclmgr.output()
