"""LMS launches in Chromium through the whole LTI 1.3 flow: the course link in the LMS → the
tool's login initiation → the LMS's auth endpoint → its form POSTed to the tool's launch →
the course page, signed in; the instructor syncs the roster with the page's button."""

import pytest
from django.contrib.auth.models import User

from lti import services
from tests import lti_platform, processes


@pytest.fixture(scope="module")
def lms():
    with lti_platform.running() as platform:
        yield platform


@pytest.fixture(scope="module")
def vclmgr_process(django_db_setup, tmp_path_factory, lms):
    child = processes.start_asgi(tmp_path_factory.mktemp("vclmgr"))
    lms.tool_base, lms.tool_jwks = child.url, f"{child.url}/lti/jwks/"
    try:
        yield child
    finally:
        child.kill()


@pytest.fixture
def vclmgr(transactional_db, vclmgr_process, lms):
    services.add_platform(actor="test", **lms.registration())
    return vclmgr_process.begin()


def open_from_lms(browser, lms, vclmgr, user):
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(20000)
    page.goto(f"{lms.url}/start?user={user}&context=net-101")
    page.wait_for_url(f"{vclmgr.url}/classes/*/")
    return context, page


def test_the_instructor_and_a_learner_launch_from_the_lms(browser, vclmgr, lms):
    context, page = open_from_lms(browser, lms, vclmgr, "ines")
    assert page.text_content("#course-title") == "Networks 101"
    page.click("#sync-roster")
    page.wait_for_selector("text=Roster synced from the LMS: 2 added, 0 removed.")
    assert sorted(page.locator("#course-members li").all_text_contents()) == [
        "ines@uni.example",
        "leo@uni.example",
        "mia@uni.example",
    ]
    context.close()

    context, page = open_from_lms(browser, lms, vclmgr, "leo")
    assert page.text_content("#course-title") == "Networks 101"
    assert page.locator("#course-members").count() == 0 and page.locator("#sync-roster").count() == 0
    context.close()
    assert User.objects.filter(email="leo@uni.example").count() == 1
    assert "LTI launch from" in vclmgr.output()
