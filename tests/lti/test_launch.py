"""LTI launches in-process against a real platform: a launch signs the user in on the course's
group; every bad launch gets the error page with its reason and writes nothing."""

import time

import pytest
from django.contrib.auth.models import Group, User
from lti_tool.models import LtiDeployment, LtiUser

from accounts import access
from accounts.models import SignOnIdentity
from lti.models import LtiCourse
from tests import lti_platform
from tests.lti.conftest import begin, launch

pytestmark = pytest.mark.django_db


def test_a_learner_lands_on_the_course_signed_in(client, platform, registration):
    answer, _ = launch(client, platform, "leo")
    course = LtiCourse.objects.get(registration=registration, context_id="net-101")
    assert answer.status_code == 302 and answer["Location"] == f"/classes/{course.group.pk}/"
    leo = User.objects.get(email="leo@uni.example")
    assert course.group.name == "Networks 101" and list(leo.groups.all()) == [course.group]
    assert access.roles(leo) == [] and not leo.has_usable_password()
    assert course.memberships_url == f"{platform.url}/nrps/net-101"
    page = client.get(answer["Location"])
    assert page.status_code == 200 and b"Networks 101" in page.content and b"lms-roster" not in page.content


def test_an_instructor_gets_the_role_and_the_roster_card(client, platform, registration):
    answer, _ = launch(client, platform, "ines")
    ines = User.objects.get(email="ines@uni.example")
    assert "instructor" in access.roles(ines)
    page = client.get(answer["Location"])
    assert b"course-members" in page.content and b"sync-roster" in page.content


def test_an_instructor_launch_keeps_a_directory_role_the_directorys(client, platform, registration):
    ines = User.objects.create_user("ines.local")
    SignOnIdentity.objects.create(
        user=ines, method="oidc", issuer=platform.issuer, subject=platform.users["ines"]["sub"]
    )
    faculty = Group.objects.create(name="faculty")
    faculty.permissions.add(access.role_group("operator").permissions.get())
    ines.groups.add(faculty)
    launch(client, platform, "ines")
    assert not ines.groups.filter(name="operator").exists() and ines.groups.filter(name="instructor").exists()
    ines.groups.remove(faculty)  # the directory takes the role back: it is gone
    assert access.roles(User.objects.get(pk=ines.pk)) == ["instructor"]


def test_the_next_launch_is_the_same_account_and_group(client, platform, registration):
    launch(client, platform, "leo")
    client.logout()
    answer, _ = launch(client, platform, "leo")
    assert answer.status_code == 302
    assert User.objects.filter(email="leo@uni.example").count() == 1 and LtiCourse.objects.count() == 1


def test_a_first_launch_that_loses_a_race_for_the_course_reads_what_the_winner_made(
    client, platform, registration, monkeypatch
):
    from django.db import IntegrityError

    from lti import services

    real, raced = services._course, []

    def course_taken_meanwhile(*args):
        if not raced:  # the other first launch committed the course between our read and our write
            raced.append(True)
            raise IntegrityError("UNIQUE constraint failed: lti_lticourse.registration_id, lti_lticourse.context_id")
        return real(*args)

    monkeypatch.setattr(services, "_course", course_taken_meanwhile)
    answer, _ = launch(client, platform, "leo")
    assert answer.status_code == 302 and raced
    assert LtiCourse.objects.count() == 1 and User.objects.filter(email="leo@uni.example").count() == 1


def test_linking_by_email_is_off_by_default(client, platform, registration):
    mia = User.objects.create_user("mia.local", email="mia@uni.example")
    launch(client, platform, "mia")
    assert not mia.groups.exists() and User.objects.filter(email="mia@uni.example").count() == 2


def test_a_launch_links_the_account_of_the_same_email(client, platform, registration, settings):
    settings.LTI_LINK_BY_EMAIL = True
    mia = User.objects.create_user("mia.local", email="MIA@uni.example")  # no password, no role
    launch(client, platform, "mia")
    assert mia.groups.filter(lti_course__isnull=False).exists()
    assert SignOnIdentity.objects.get(user=mia).subject == platform.users["mia"]["sub"]


def _operator(user):
    access.set_roles(user, ["operator"], actor="test")


def _directory_approver(user):
    faculty = Group.objects.create(name="faculty")
    faculty.permissions.add(access.role_group("approver").permissions.get())
    user.groups.add(faculty)


def _password(user):
    user.set_password("a-password-of-theirs")
    user.save()


def _other_sign_on(user):
    SignOnIdentity.objects.create(user=user, method="oidc", issuer="https://idp.example", subject="mia")


NOT_LINKED = {
    "an operator": _operator,
    "a role through a directory group": _directory_approver,
    "a superuser": lambda user: User.objects.filter(pk=user.pk).update(is_superuser=True),
    "an inactive administrator": lambda user: User.objects.filter(pk=user.pk).update(is_staff=True, is_active=False),
    "a usable password": _password,
    "another issuer's identity": _other_sign_on,
}


@pytest.mark.parametrize("case", NOT_LINKED)
def test_an_email_never_takes_over_an_account_that_is_someones(client, platform, registration, settings, case):
    settings.LTI_LINK_BY_EMAIL = True
    mia = User.objects.create_user("mia.local", email="mia@uni.example")
    NOT_LINKED[case](mia)
    answer, _ = launch(client, platform, "mia")
    assert answer.status_code == 302
    assert not mia.groups.filter(lti_course__isnull=False).exists()
    assert not SignOnIdentity.objects.filter(user=mia, issuer=platform.issuer).exists()
    assert int(client.session["_auth_user_id"]) != mia.pk


def test_a_disabled_account_is_refused(client, platform, registration):
    launch(client, platform, "leo")
    User.objects.filter(email="leo@uni.example").update(is_active=False)
    client.logout()
    answer, _ = launch(client, platform, "leo")
    assert answer.status_code == 403 and b"disabled" in answer.content and "_auth_user_id" not in client.session


def test_an_administrators_email_is_not_linked(client, platform, registration, settings):
    settings.LTI_LINK_BY_EMAIL = True
    boss = User.objects.create_user("boss", email="mia@uni.example", is_staff=True)
    launch(client, platform, "mia")
    assert not boss.groups.exists() and User.objects.filter(email="mia@uni.example").count() == 2


@pytest.mark.parametrize("flag", ["is_staff", "is_superuser"])
def test_an_earlier_launchs_account_made_administrator_is_refused(client, platform, registration, flag):
    launch(client, platform, "leo")
    User.objects.filter(email="leo@uni.example").update(**{flag: True})
    client.logout()
    answer, _ = launch(client, platform, "leo")
    assert answer.status_code == 403 and b"administrator" in answer.content
    assert "_auth_user_id" not in client.session


def test_a_sign_on_subject_of_an_administrator_is_refused(client, platform, registration):
    boss = User.objects.create_user("boss", is_staff=True)
    leo = platform.users["leo"]["sub"]
    SignOnIdentity.objects.create(user=boss, method="oidc", issuer=platform.issuer, subject=leo)
    before = counts()
    answer, _ = launch(client, platform, "leo")
    assert answer.status_code == 403 and b"sign in with their own" in answer.content
    assert "_auth_user_id" not in client.session and not boss.groups.exists()
    assert counts()[:3] == before[:3]  # no account, group or course made


def test_an_existing_sign_on_subject_is_the_account(client, platform, registration):
    ann = User.objects.create_user("ann")
    SignOnIdentity.objects.create(user=ann, method="oidc", issuer=platform.issuer, subject=platform.users["leo"]["sub"])
    launch(client, platform, "leo")
    assert ann.groups.count() == 1 and not User.objects.filter(email="leo@uni.example").exists()


def test_a_course_titled_like_a_role_group_is_a_group_of_its_own(client, platform, registration):
    platform.contexts["ops"] = {"title": "operator", "roles": {"leo": [lti_platform.LEARNER]}}
    try:
        launch(client, platform, "leo", "ops")
    finally:
        del platform.contexts["ops"]
    leo = User.objects.get(email="leo@uni.example")
    assert access.roles(leo) == [] and LtiCourse.objects.get(context_id="ops").group.name == "operator (2)"


def test_the_jwks_publishes_the_tools_public_key(client, registration):
    keys = client.get("/lti/jwks/").json()["keys"]
    assert len(keys) == 1 and keys[0]["kty"] == "RSA" and "d" not in keys[0]


# --- bad launches -----------------------------------------------------------------------


def counts():
    return (
        User.objects.count(),
        Group.objects.count(),
        LtiCourse.objects.count(),
        LtiUser.objects.count(),
        LtiDeployment.objects.count(),
        SignOnIdentity.objects.count(),
    )


def post_token(client, platform, user="leo", **overrides):
    query, _ = begin(client, platform, user)
    token = platform.id_token(user, "net-101", query["nonce"], **overrides)
    return client.post("/lti/launch/", {"id_token": token, "state": query["state"]})


BAD = {
    "bad signature": (dict(key=lti_platform.new_key()), 403, b"signature does not match"),
    "unknown issuer": (dict(iss="https://lms.elsewhere.example"), 403, b"does not know"),
    "unknown deployment": (dict(lti_deployment_id="deployment-9"), 403, b"deployment is not registered"),
    "expired": (dict(exp=int(time.time()) - 120, iat=int(time.time()) - 600), 403, b"has expired"),
    "wrong audience": (dict(aud="another-tool", azp="another-tool"), 403, b"does not know"),
    "unknown key": (dict(kid="not-published"), 403, b"key the platform does not publish"),
    "not a resource link": (
        {
            "lti_message_type": "LtiDeepLinkingRequest",
            "https://purl.imsglobal.org/spec/lti-dl/claim/deep_linking_settings": {
                "deep_link_return_url": "http://127.0.0.1:9/return",
                "accept_types": ["ltiResourceLink"],
                "accept_presentation_document_targets": ["window"],
            },
        },
        400,
        b"resource link launches only",
    ),
    "no context": (dict(lti_context=None), 400, b"names no course"),
    "no expiry": (dict(exp=None), 400, b"no expiry"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_launch_is_refused_and_writes_nothing(client, platform, registration, case):
    overrides, status, reason = BAD[case]
    before = counts()
    answer = post_token(client, platform, **overrides)
    assert answer.status_code == status, answer.content
    assert b"LMS launch refused" in answer.content and reason in answer.content
    assert counts() == before and "_auth_user_id" not in client.session


def test_a_replayed_launch_is_refused(client, platform, registration):
    answer, fields = launch(client, platform, "leo")
    assert answer.status_code == 302
    client.logout()
    before = counts()
    again = client.post("/lti/launch/", fields)
    assert again.status_code == 403 and b"used already" in again.content
    assert counts() == before and "_auth_user_id" not in client.session


def test_a_used_token_stays_spent_while_its_nonce_lives(client, platform, registration):
    from datetime import timedelta

    from django.utils import timezone

    from lti import services
    from lti.models import SpentToken

    SpentToken.objects.create(digest="0" * 64, expires=timezone.now() - timedelta(seconds=1))
    launch(client, platform, "leo")
    mark = SpentToken.objects.get()  # the expired mark pruned, this launch's kept
    assert mark.expires > timezone.now() + timedelta(seconds=services.NONCE_LIFETIME)


def test_a_launch_that_fails_gives_its_token_back(client, platform, registration, monkeypatch):
    from lti import services
    from lti.models import SpentToken

    _, location = begin(client, platform, "leo")
    _, fields = platform.authorize(location)
    monkeypatch.setattr(services, "_admit", lambda *args: (_ for _ in ()).throw(RuntimeError("database gone")))
    with pytest.raises(RuntimeError):
        client.post("/lti/launch/", fields)
    assert not SpentToken.objects.exists()
    monkeypatch.undo()
    assert client.post("/lti/launch/", fields).status_code == 302


def test_a_nonce_the_tool_never_gave_is_refused(client, platform, registration):
    query, _ = begin(client, platform)
    token = platform.id_token("leo", "net-101", "a-nonce-of-my-own")
    answer = client.post("/lti/launch/", {"id_token": token, "state": query["state"]})
    assert answer.status_code == 403 and b"nonce" in answer.content


def test_a_missing_or_mismatched_state_is_refused(client, platform, registration):
    query, _ = begin(client, platform)
    token = platform.id_token("leo", "net-101", query["nonce"])
    before = counts()
    missing = client.post("/lti/launch/", {"id_token": token})
    assert missing.status_code == 400 and b"no state" in missing.content
    forged = client.post("/lti/launch/", {"id_token": token, "state": "state-forged"})
    assert forged.status_code == 403 and b"did not start this launch" in forged.content
    assert counts() == before


def test_a_launch_with_no_token_is_a_400(client, registration):
    answer = client.post("/lti/launch/", {"state": "state-x"})
    assert answer.status_code == 400 and b"no ID token" in answer.content


@pytest.mark.parametrize(
    "target",
    [
        "https://evil.example/collect",
        "https://evil.example/lti/launch/",
        "http://testserver.evil.example/lti/launch/",
        "https://testserver/lti/launch/",
        "http://testserver:8080/lti/launch/",
    ],
)
def test_a_login_sending_the_token_elsewhere_is_refused(client, platform, registration, target):
    params = {**platform.initiation("leo", "net-101"), "target_link_uri": target}
    answer = client.get("/lti/login/", params)
    assert answer.status_code == 400 and b"launch URL" in answer.content


def test_a_login_to_our_launch_url_with_its_default_port_is_taken(client, platform, registration):
    params = {**platform.initiation("leo", "net-101"), "target_link_uri": "http://TestServer:80/lti/launch/"}
    assert client.get("/lti/login/", params).status_code == 302


@pytest.mark.parametrize("target", ["http://[x", "http://testserver:99999/lti/launch/"])
def test_a_login_with_a_malformed_target_is_a_400(client, platform, registration, target):
    params = {**platform.initiation("leo", "net-101"), "target_link_uri": target}
    answer = client.get("/lti/login/", params)
    assert answer.status_code == 400 and b"not a valid URL" in answer.content


def test_a_roster_sync_of_a_huge_group_id_is_a_404(client, registration):
    client.force_login(User.objects.create_superuser("root"))
    assert client.post(f"/lti/courses/{2**64}/roster/sync/").status_code == 404


def test_a_login_from_an_unknown_platform_is_refused(client, platform, registration):
    params = {**platform.initiation("leo", "net-101"), "iss": "https://lms.elsewhere.example"}
    answer = client.get("/lti/login/", params)
    assert answer.status_code == 403 and b"does not know" in answer.content


def test_the_login_initiation_may_be_a_post(client, platform, registration):
    answer = client.post("/lti/login/", platform.initiation("leo", "net-101"))
    assert answer.status_code == 302 and answer["Location"].startswith(f"{platform.url}/auth?")
    action, fields = platform.authorize(answer["Location"])
    assert client.post("/lti/launch/", fields).status_code == 302
