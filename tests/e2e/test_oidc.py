"""Sign-on through OpenID Connect in Chromium: vclmgr's login page → the provider's → back, signed in."""

from django.contrib.auth.models import User

from tests import oidc_provider

provider, vclmgr = oidc_provider.provider, oidc_provider.vclmgr  # the fixtures


def test_a_student_signs_in_with_the_campus_provider(sso_page, vclmgr):
    sso_page.goto("/login/")
    sso_page.click("text=Sign in with Campus ID")
    sso_page.wait_for_url("**/accounts/login/**")
    sso_page.fill("input[name=username]", "ann")
    sso_page.fill("input[name=password]", "ann-pass")
    sso_page.click("button[type=submit]")
    sso_page.wait_for_url(f"{vclmgr.url}/")

    assert "ann" in sso_page.content()
    assert list(User.objects.get(username="ann").groups.values_list("name", flat=True)) == ["cs101"]
