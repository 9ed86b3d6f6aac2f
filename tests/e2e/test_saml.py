"""Sign-on through SAML in Chromium: vclmgr's login page → the IdP's (pysaml2, tests/saml_idp.py)
→ its self-submitting answer to vclmgr's ACS → signed in; then "Log out" signs out at the IdP too."""

from django.contrib.auth.models import User

from tests import saml_idp

idp, sp_keys, vclmgr = saml_idp.idp, saml_idp.sp_keys, saml_idp.vclmgr  # the fixtures


def test_a_student_signs_in_and_out_through_the_campus_idp(sso_page, vclmgr, idp):
    sso_page.goto("/login/")
    sso_page.click("text=Sign in with Campus SSO")
    sso_page.wait_for_url(f"{idp.url}/sso/redirect**")
    sso_page.fill("input[name=username]", "ann")
    sso_page.fill("input[name=password]", "ann-pass")
    sso_page.click("button[type=submit]")
    sso_page.wait_for_url(f"{vclmgr.url}/")

    assert "ann@uni.example" in sso_page.content()
    groups = User.objects.get(username="ann@uni.example").groups.values_list("name", flat=True)
    assert sorted(groups) == ["cs101", "students"]

    sso_page.click("text=Log out")
    sso_page.wait_for_url(f"{vclmgr.url}/login/")

    assert idp.events("logout")[-1]["sp"] == f"{vclmgr.url}/saml2/metadata/"
    sso_page.goto("/")
    assert "/login/" in sso_page.url
