"""Hostile request bodies get a 4xx in the API's error format, never a server error."""

import json

import pytest

URL = "/api/v1/jobs/"


def error_of(response, status):
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    return response.json()["error"]


def test_it_refuses_json_nested_50000_levels_with_400(db, api, alice):
    body = '{"opcode": "noop", "params": ' + "[" * 50_000 + "]" * 50_000 + "}"
    error = error_of(api(alice).post(URL, body, content_type="application/json"), 400)
    assert "API_MAX_JSON_DEPTH" in error["message"]


def test_brackets_inside_strings_do_not_count_as_depth(db, api, alice):
    body = json.dumps({"opcode": "noop", "reason": "[" * 100 + '\\"{' * 50})
    assert api(alice).post(URL, body, content_type="application/json").status_code == 202


def test_it_refuses_a_json_body_over_the_size_limit_with_413(db, api, alice, settings):
    settings.API_MAX_BODY_BYTES = 2048
    body = json.dumps({"opcode": "noop", "reason": "x" * 4000})
    error = error_of(api(alice).post(URL, body, content_type="application/json"), 413)
    assert "API_MAX_BODY_BYTES" in error["message"]


def test_it_refuses_nul_anywhere_in_json_naming_the_field(db, api, alice):
    body = {"opcode": "noop", "params": {"note": "a\x00b"}}
    error = error_of(api(alice).post(URL, body, format="json"), 400)
    assert error["fields"] == {"params.note": ["Null characters are not allowed."]}


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/x-www-form-urlencoded", "&".join(f"f{i}=1" for i in range(1200))),
        (
            "multipart/form-data; boundary=xx",
            "".join(f'--xx\r\nContent-Disposition: form-data; name="f{i}"\r\n\r\nv\r\n' for i in range(1200))
            + "--xx--\r\n",
        ),
        ("multipart/form-data", "no boundary"),
        ("multipart/form-data; boundary=xx", "--xx\r\n" + "X" * 100_000 + "\r\n\r\n--xx--"),
    ],
    ids=["form-too-many-fields", "multipart-too-many-fields", "multipart-no-boundary", "multipart-huge-header"],
)
def test_a_malformed_form_body_gets_a_json_400(db, api, alice, content_type, body):
    error = error_of(api(alice).generic("POST", URL, body.encode(), content_type=content_type), 400)
    assert error["code"] == "parse_error" and error["message"]


@pytest.mark.parametrize("query", ["search=a%00b", "opcode=%00", "ordering=%00id", "page=%00"])
def test_a_nul_in_the_query_string_is_a_400_naming_the_parameter(db, api, alice, query):
    error = error_of(api(alice).get(f"{URL}?{query}"), 400)
    assert query.split("=")[0] in error["fields"]
