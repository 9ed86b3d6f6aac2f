"""Fuzz every operation of the OpenAPI schema (schemathesis, bounded examples):
no server errors, every response conforms to the schema.

Grows on its own: endpoints added later are fuzzed too. Runs as a staff user with a
read-write token, the persona that reaches the most code.
"""

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from vclmgr import tokens

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture
def api_schema(db, settings):
    settings.API_SCHEMA_ACCESS = "public"  # schemathesis reads the schema without credentials
    # As Django's test client does: a finished request must not close the test's connection.
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    yield schemathesis.openapi.from_wsgi("/api/v1/schema/", get_wsgi_application())
    for signal in (request_started, request_finished):
        signal.connect(close_old_connections)


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture
def fuzz_token(admin_user):
    return tokens.issue(admin_user, "fuzz", write_enabled=True)[1]


@schema.parametrize()
@settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_api_conforms_to_its_schema(case, fuzz_token):
    case.call_and_validate(headers={"Authorization": f"Bearer {fuzz_token}"}, checks=CHECKS)
