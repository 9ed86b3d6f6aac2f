"""The OpenAPI schema says what the API answers: nullable where it can be null, plain strings
where values need not match a format, every error in the one error format."""

import pytest
import yaml
from django.contrib.auth import get_user_model
from django.db import transaction
from rest_framework.test import APIClient

from accounts import tokens


@pytest.fixture(scope="module")
def schema(django_db_setup, django_db_blocker):
    """Generated once for the module's tests (it takes most of a minute); they only read it. The
    staff user it is asked for is rolled back with everything else the request wrote."""
    with django_db_blocker.unblock(), transaction.atomic():
        admin = get_user_model().objects.create_user("admin", "admin@example.org", is_staff=True, is_superuser=True)
        _, clear = tokens.issue(admin, "schema", scopes="all")
        response = APIClient(HTTP_AUTHORIZATION=f"Bearer {clear}").get("/api/v1/schema/")
        transaction.set_rollback(True)
    assert response.status_code == 200
    return yaml.safe_load(response.content)


def test_a_reservations_user_and_vm_state_may_be_null(schema):
    properties = schema["components"]["schemas"]["Reservation"]["properties"]
    assert properties["user"].get("nullable") and properties["vm_state"].get("nullable")


def test_a_users_email_may_be_blank(schema):
    email = schema["components"]["schemas"]["User"]["properties"]["email"]
    assert "format" not in email and email["type"] == "string"


def test_every_error_response_has_the_error_body(schema):
    missing = [
        f"{method.upper()} {path} {code}"
        for path, operations in schema["paths"].items()
        for method, operation in operations.items()
        for code, response in operation["responses"].items()
        if int(code) >= 400 and "content" not in response
    ]
    assert not missing, missing
    discover = schema["paths"]["/api/v1/hypervisors/discover/"]["post"]["responses"]
    assert discover["502"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}


@pytest.mark.parametrize("query", ["page_size=null", "page_size=0", "page=0", "page=-1", "page_size=%C2%B2"])
def test_a_page_or_page_size_that_is_not_a_positive_integer_is_a_400(db, api, alice, query):
    response = api(alice).get(f"/api/v1/tokens/?{query}")
    assert response.status_code == 400, response.content[:300]
    assert query.split("=")[0] in response.json()["error"]["fields"]


def test_pages_are_documented_as_positive(schema):
    parameters = {p["name"]: p for p in schema["paths"]["/api/v1/tokens/"]["get"]["parameters"]}
    assert parameters["page"]["schema"]["minimum"] == 1 and parameters["page_size"]["schema"]["minimum"] == 1


@pytest.mark.parametrize("url", ["/api/v1/image-variants/", "/api/v1/hypervisors/"])
def test_a_method_an_endpoint_does_not_offer_is_a_405_for_everyone(db, api, alice, url):
    response = api(alice).generic("TRACE", url)
    assert response.status_code == 405, response.content[:300]


@pytest.mark.parametrize("value", ["AAA", "null", "yes"])
def test_a_boolean_filter_given_something_else_is_a_400(db, api, alice, value):
    response = api(alice).get(f"/api/v1/jobs/?archived={value}")
    assert response.status_code == 400 and "archived" in response.json()["error"]["fields"], response.content[:300]


def test_a_boolean_filter_still_filters(db, api, alice):
    assert api(alice).get("/api/v1/jobs/?archived=false").status_code == 200
    assert api(alice).get("/api/v1/jobs/?archived=").status_code == 200
