"""The admin's LTI pages: a platform registered through the services; keys shown without their
private half."""

import pytest
from lti_tool.models import Key, LtiRegistration

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
