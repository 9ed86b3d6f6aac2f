"""Roster sync through the platform's Names and Role Provisioning Service: the tool gets an
access token with a client assertion signed by its key (checked by the platform against the
tool's JWKS), reads the roster, and the course group's members follow it."""

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from accounts import access
from accounts.models import SignOnIdentity
from core.errors import Conflict
from lti import services
from lti.models import LtiCourse
from tests import lti_platform
from tests.lti.conftest import launch

pytestmark = pytest.mark.django_db


@pytest.fixture
def course(client, platform, registration):
    platform.tool_jwks = services.jwks()
    answer, _ = launch(client, platform, "ines")
    assert answer.status_code == 302
    return LtiCourse.objects.select_related("registration", "group").get()


def members(course):
    return sorted(course.group.user_set.values_list("email", flat=True))


def test_sync_adds_the_roster_and_removes_who_left(course, platform):
    result = services.sync_roster(course, actor="test")
    assert members(course) == ["ines@uni.example", "leo@uni.example", "mia@uni.example"]
    assert sorted(result["added"]) == ["leo@uni.example", "mia@uni.example"] and result["removed"] == []
    assert platform.token_requests[-1]["scope"] == lti_platform.NRPS_SCOPE

    hand_added = User.objects.create_user("guest")
    course.group.user_set.add(hand_added)
    del platform.contexts["net-101"]["roles"]["mia"]
    try:
        result = services.sync_roster(course, actor="test")
    finally:
        platform.contexts["net-101"]["roles"]["mia"] = [lti_platform.LEARNER]
    assert result == {"added": [], "removed": ["mia@uni.example"], "skipped": []}
    assert set(course.group.user_set.values_list("username", flat=True)) == {
        "ines@uni.example",
        "leo@uni.example",
        "guest",
    }
    assert access.roles(User.objects.get(email="leo@uni.example")) == []


def test_a_hand_added_member_the_lms_signed_in_elsewhere_stays(course, platform):
    """An LMS account of this issuer (another course's student), added to this group by hand."""
    guest = User.objects.create_user("guest")
    SignOnIdentity.objects.create(user=guest, method="lti", issuer=platform.issuer, subject="another-course-student")
    course.group.user_set.add(guest)
    result = services.sync_roster(course, actor="test")
    assert result["removed"] == [] and "guest" in course.group.user_set.values_list("username", flat=True)


def test_a_member_the_roster_removed_and_added_back_by_hand_stays(course, platform):
    services.sync_roster(course, actor="test")
    del platform.contexts["net-101"]["roles"]["mia"]
    try:
        assert services.sync_roster(course, actor="test")["removed"] == ["mia@uni.example"]
        course.group.user_set.add(User.objects.get(email="mia@uni.example"))
        assert services.sync_roster(course, actor="test")["removed"] == []
    finally:
        platform.contexts["net-101"]["roles"]["mia"] = [lti_platform.LEARNER]
    assert "mia@uni.example" in members(course)


@pytest.fixture
def big_roster(course, platform):
    """200 more learners and 10 more instructors on the course's roster (taken off again after)."""
    hints = [f"student{n}" for n in range(200)] + [f"teacher{n}" for n in range(10)]
    for hint in hints:
        platform.users[hint] = lti_platform.person(f"sub-{hint}", f"{hint}@uni.example", hint, "Many")
        role = lti_platform.INSTRUCTOR if hint.startswith("teacher") else lti_platform.LEARNER
        platform.contexts["net-101"]["roles"][hint] = [role]
    try:
        yield hints
    finally:
        for hint in hints:
            del platform.users[hint], platform.contexts["net-101"]["roles"][hint]


def test_a_big_roster_syncs_in_a_bounded_number_of_statements(course, big_roster):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as first:
        result = services.sync_roster(course, actor="test")
    assert len(result["added"]) == 212 and len(members(course)) == 213
    assert len([u for u in User.objects.filter(groups__name="instructor")]) == 11
    with CaptureQueriesContext(connection) as again:
        assert services.sync_roster(course, actor="test") == {"added": [], "removed": [], "skipped": []}
    # Made accounts cost a few statements each (the user, its change-log row, a free name);
    # everything else is per roster.
    assert len(first) < 212 * 4 + 40, len(first)
    assert len(again) < 30, len(again)


def _disabled_and_admin(client, platform, course):
    """Leo's account disabled, Mia's made an administrator's after their first launches."""
    for hint in ("leo", "mia"):
        client.logout()
        launch(client, platform, hint)
    course.group.user_set.remove(*User.objects.filter(email__in=["leo@uni.example", "mia@uni.example"]))
    User.objects.filter(email="leo@uni.example").update(is_active=False)
    User.objects.filter(email="mia@uni.example").update(is_staff=True)


def test_sync_skips_disabled_and_administrators_accounts(client, course, platform):
    _disabled_and_admin(client, platform, course)
    result = services.sync_roster(course, actor="test")
    assert result == {"added": [], "removed": [], "skipped": ["leo@uni.example", "mia@uni.example"]}
    assert members(course) == ["ines@uni.example"]
    assert not User.objects.get(email="mia@uni.example").groups.exists()


def test_sync_keeps_a_skipped_member_who_is_in_the_group(client, course, platform):
    services.sync_roster(course, actor="test")
    User.objects.filter(email="leo@uni.example").update(is_active=False)
    result = services.sync_roster(course, actor="test")
    assert result["skipped"] == ["leo@uni.example"] and result["removed"] == []
    assert "leo@uni.example" in members(course)


def test_the_button_and_the_cli_report_the_skipped(client, course, platform, capsys):
    _disabled_and_admin(client, platform, course)
    client.force_login(User.objects.get(email="ines@uni.example"))
    answer = client.post(f"/lti/courses/{course.group.pk}/roster/sync/")
    page = client.get(answer["Location"])
    assert b"0 added, 0 removed. Skipped (disabled or administrators&#x27; accounts): leo@uni.example" in page.content
    call_command("lti", "sync-roster", str(course.group.pk))
    assert "skipped (disabled or administrators' accounts) leo@uni.example mia@uni.example" in capsys.readouterr().out


def test_a_launch_after_sync_is_the_same_account(client, course, platform):
    services.sync_roster(course, actor="test")
    client.logout()
    launch(client, platform, "leo")
    assert User.objects.filter(email="leo@uni.example").count() == 1


def test_the_platform_refusing_our_assertion_changes_nothing(course, platform):
    platform.tool_jwks = {"keys": []}  # it does not know our key
    with pytest.raises(Conflict, match="refused the roster request"):
        services.sync_roster(course, actor="test")
    assert members(course) == ["ines@uni.example"]


def test_a_rotated_key_signs_and_the_old_one_stays_published_until_retired(course, platform):
    old = services.jwks()["keys"][0]["kid"]
    new, retired = services.rotate_keys(actor="test")
    assert retired == [] and {k["kid"] for k in services.jwks()["keys"]} == {old, new}
    platform.tool_jwks = {"keys": [k for k in services.jwks()["keys"] if k["kid"] == new]}
    services.sync_roster(course, actor="test")  # signed with the new key: the platform accepts it
    _, retired = services.rotate_keys(actor="test", retire_after_days=0)
    assert set(retired) == {old, new} and old not in {k["kid"] for k in services.jwks()["keys"]}


def test_the_instructors_button_syncs(client, course):
    answer = client.post(f"/classes/{course.group.pk}/".replace("/classes/", "/lti/courses/") + "roster/sync/")
    assert answer.status_code == 302
    page = client.get(answer["Location"])
    assert b"3 members" not in page.content and b"2 added" in page.content
    assert len(members(course)) == 3


def test_a_learner_cannot_sync(client, course, platform):
    client.logout()
    launch(client, platform, "leo")
    assert client.post(f"/lti/courses/{course.group.pk}/roster/sync/").status_code == 404
    assert members(course) == ["ines@uni.example", "leo@uni.example"]


def test_the_cli_syncs_a_course(course, capsys):
    call_command("lti", "sync-roster", str(course.group.pk))
    assert "added leo@uni.example mia@uni.example" in capsys.readouterr().out
