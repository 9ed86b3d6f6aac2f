"""The OpenAPI schema says what the API answers: nullable where it can be null, plain strings
where values need not match a format, every error in the one error format."""

import pytest
import yaml


@pytest.fixture
def schema(db, api, admin_user):
    response = api(admin_user).get("/api/v1/schema/")
    assert response.status_code == 200
    return yaml.safe_load(response.content)


def test_a_reservations_user_and_vm_state_may_be_null(schema):
    properties = schema["components"]["schemas"]["Reservation"]["properties"]
    assert properties["user"].get("nullable") and properties["vm_state"].get("nullable")


def test_a_users_email_may_be_blank(schema):
    email = schema["components"]["schemas"]["User"]["properties"]["email"]
    assert "format" not in email and email["type"] == "string"


def test_every_error_response_has_the_error_body(schema):
    missing = [f"{method.upper()} {path} {code}" for path, operations in schema["paths"].items()
               for method, operation in operations.items() for code, response in operation["responses"].items()
               if int(code) >= 400 and "content" not in response]
    assert not missing, missing
    discover = schema["paths"]["/api/v1/hypervisors/discover/"]["post"]["responses"]
    assert discover["502"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
