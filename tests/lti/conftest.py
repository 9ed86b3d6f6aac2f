"""The LTI tests' platform: one real platform (tests/lti_platform.py) per module."""

from urllib.parse import parse_qs, urlsplit

import pytest

from lti import services
from tests import lti_platform


@pytest.fixture(scope="module")
def platform():
    with lti_platform.running() as lms:
        yield lms


@pytest.fixture
def registration(db, platform):
    return services.add_platform(actor="test", **platform.registration())


def begin(client, platform, user="leo", context="net-101"):
    """The login initiation through the tool: (the auth request's query, as a dict, and its URL)."""
    answer = client.get("/lti/login/", platform.initiation(user, context))
    assert answer.status_code == 302, answer.content
    location = answer["Location"]
    assert location.startswith(f"{platform.url}/auth?")
    return {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}, location


def launch(client, platform, user="leo", context="net-101"):
    """A whole launch: initiation, the platform's auth endpoint, the POST of its form."""
    _, location = begin(client, platform, user, context)
    action, fields = platform.authorize(location)
    assert action == "http://testserver/lti/launch/"
    return client.post("/lti/launch/", fields), fields
