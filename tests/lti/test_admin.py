"""The admin's LTI pages: a platform registered through the services; keys shown without their
private half, and rotated by an administrator's action."""

from datetime import timedelta

import pytest
from django.utils import timezone
from lti_tool.models import Key, LtiRegistration

from core.models import ObjectChange
from lti import services

pytestmark = pytest.mark.django_db

FORM = {
    "name": "Campus Moodle",
    "issuer": "https://moodle.example.edu",
    "client_id": "Xy12",
    "audience": "",
    "keyset_url": "https://moodle.example.edu/mod/lti/certs.php",
    "auth_url": "https://moodle.example.edu/mod/lti/auth.php",
    "token_url": "https://moodle.example.edu/mod/lti/token.php",
    "is_active": "on",
    "deployment_ids": "3\n4\n",
}


def test_an_administrator_registers_a_platform_in_the_admin(client, admin_user):
    client.force_login(admin_user)
    answer = client.post("/admin/lti_tool/ltiregistration/add/", FORM)
    assert answer.status_code == 302, answer.content
    registration = LtiRegistration.objects.get()
    assert sorted(registration.deployments.values_list("deployment_id", flat=True)) == ["3", "4"]
    page = client.get(f"/admin/lti_tool/ltiregistration/{registration.pk}/change/")
    assert page.status_code == 200 and b"private_key" not in page.content and b"PRIVATE KEY" not in page.content
    keys = client.get("/admin/lti_tool/key/")
    assert keys.status_code == 200 and str(Key.objects.get()).encode() in keys.content
    refused = client.post(
        f"/admin/lti_tool/ltiregistration/{registration.pk}/change/",
        {**FORM, "deployment_ids": "  \n "},
    )
    assert refused.status_code == 200 and b"errorlist" in refused.content
    assert registration.deployments.filter(is_active=True).count() == 2
    key_page = client.get(f"/admin/lti_tool/key/{Key.objects.get().pk}/change/")
    assert key_page.status_code == 200 and b"PRIVATE KEY" not in key_page.content


def test_an_administrator_rotates_the_keys_in_the_admin(client, admin_user, alice, settings):
    services.rotate_keys(actor="test")  # the first key, older than the retirement age
    old = Key.objects.get()
    Key.objects.filter(pk=old.pk).update(
        datetime_created=timezone.now() - timedelta(days=settings.LTI_KEY_RETIRE_DAYS + 1)
    )
    client.force_login(admin_user)
    answer = client.post("/admin/lti_tool/key/", {"action": "rotate", "_selected_action": [old.pk]}, follow=True)
    [new] = Key.objects.active()
    assert new.pk != old.pk and not Key.objects.get(pk=old.pk).is_active
    assert f"New key {new}; retired 1." in answer.content.decode()
    made = ObjectChange.objects.get(object_id=str(new.pk), reason="LTI key rotation")
    assert made.user == admin_user and made.changes == {"retired": [str(old)]}

    client.force_login(alice)  # no administrator: the admin is not hers
    refused = client.post("/admin/lti_tool/key/", {"action": "rotate", "_selected_action": [new.pk]})
    assert refused.status_code == 302 and "/login/" in refused["Location"]
    assert list(Key.objects.active()) == [new]
