"""A platform that accepts a connection and never answers (tests/silent_peer.py) costs a launch
or a roster sync ``LTI_TIMEOUT_SECONDS``, not a thread for good; and nothing is written."""

import time

import pytest
from django.contrib.auth.models import User
from lti_tool.models import LtiRegistration

from core.errors import Conflict
from lti import services
from lti.models import LtiCourse
from tests.lti.conftest import launch
from tests.silent_peer import SilentPeer

pytestmark = pytest.mark.django_db


def test_a_silent_key_set_fails_the_launch_within_the_timeout(client, platform, registration, settings):
    settings.LTI_TIMEOUT_SECONDS = 1
    with SilentPeer() as peer:
        LtiRegistration.objects.filter(pk=registration.pk).update(keyset_url=f"http://127.0.0.1:{peer.port}/jwks")
        start = time.monotonic()
        answer, _ = launch(client, platform, "leo")
        took = time.monotonic() - start
        assert peer.accepted >= 1
    assert answer.status_code == 502 and b"key set could not be read" in answer.content
    assert took < 5 and not User.objects.exists() and not LtiCourse.objects.exists()


def test_a_silent_token_url_fails_the_roster_sync_within_the_timeout(client, platform, registration, settings):
    launch(client, platform, "ines")
    course = LtiCourse.objects.select_related("registration", "group").get()
    settings.LTI_TIMEOUT_SECONDS = 1
    with SilentPeer() as peer:
        LtiRegistration.objects.filter(pk=registration.pk).update(token_url=f"http://127.0.0.1:{peer.port}/token")
        course.registration.refresh_from_db()
        start = time.monotonic()
        with pytest.raises(Conflict, match="could not be read"):
            services.sync_roster(course, actor="test")
        assert time.monotonic() - start < 5 and peer.accepted == 1
    assert course.group.user_set.count() == 1
