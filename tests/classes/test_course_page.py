"""A course's page: its members open it, an instructor sees the roster, anyone else gets a 404."""

import pytest
from django.contrib.auth.models import Group

from accounts import access

pytestmark = pytest.mark.django_db


@pytest.fixture
def course(alice, bob):
    group = Group.objects.create(name="cs101")
    group.user_set.add(alice, bob)
    return group


def test_a_member_opens_the_course_without_the_roster(client, course, bob):
    client.force_login(bob)
    page = client.get(f"/classes/{course.pk}/")
    assert page.status_code == 200
    assert b"cs101" in page.content and b"course-members" not in page.content


def test_the_instructor_sees_the_roster(client, course, alice):
    access.set_roles(alice, ["instructor"], actor=alice)
    client.force_login(alice)
    page = client.get(f"/classes/{course.pk}/")
    assert page.status_code == 200 and b"course-members" in page.content and b"bob" in page.content


def test_someone_outside_the_course_gets_a_404(client, course, django_user_model):
    client.force_login(django_user_model.objects.create_user("mallory"))
    assert client.get(f"/classes/{course.pk}/").status_code == 404


def test_a_role_group_is_no_course(client, alice):
    access.set_roles(alice, ["instructor"], actor=alice)
    client.force_login(alice)
    assert client.get(f"/classes/{access.role_group('instructor').pk}/").status_code == 404


def test_signing_in_comes_first(client, course):
    assert client.get(f"/classes/{course.pk}/").status_code == 302


def test_an_id_beyond_the_columns_range_is_a_404_not_a_server_error(client, alice):
    client.force_login(alice)
    assert client.get(f"/classes/{2**64}/").status_code == 404
    assert client.get(f"/classes/{2**64}/classes/{2**64}/").status_code == 404
