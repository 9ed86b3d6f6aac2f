"""Fuzz every operation of the OpenAPI schema (schemathesis, bounded examples, positive and
negative data) with every check schemathesis has (the CLI's ``--checks all``): no server
errors, every response conforms to the schema, invalid input is refused, valid input accepted.

Grows on its own: endpoints added later are fuzzed too. Runs as a staff user (the persona that
reaches the most code) and as a plain user, each with a read-write token. An operation a role
guards that the plain user lacks is refused before the request is read, whatever it holds: the
plain user gets the generated cases there (each must be a conforming 403), not the coverage
phase's hundreds of input variants that would all meet the same refusal. Where the plain user is
let in, the coverage phase sends them its valid variants (what the persona changes: whose things
are listed, found, counted against quotas) and the generated cases, valid and invalid; its
hundreds of invalid variants of each parameter and property meet the same serializers and
filters as the staff user's, who is sent every one of them.

The operations are dealt into ``PARTS`` parts of about equal cost, one test item per part and
persona, so parallel workers (pytest-xdist) share the fuzzing instead of one worker doing a
persona alone. The deal is computed from the schema served, so a new endpoint lands in a part
by itself; ``test_every_operation_is_fuzzed_in_exactly_one_part_per_persona`` proves the parts
cover the schema exactly once for each persona.
"""

import copy
import json
import re

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.urls import Resolver404, resolve
from hypothesis import HealthCheck, Phase, settings
from rest_framework.permissions import SAFE_METHODS
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from accounts import tokens
from accounts.api.permissions import RoleRequired
from core.api.throttling import AnonThrottle

load_all_checks()


@schemathesis.check
def negative_query_and_path_rejection(ctx, response, case):
    """``negative_data_rejection`` for query, path and header parameters only. In bodies DRF
    coerces scalars by design (``1`` → ``"1"``, ``"true"`` → true, ISO 8601 times beyond RFC
    3339's date-time): those mutations are accepted, and that is the API's documented
    behaviour, not a schema mismatch. Likewise a filter sent empty means "not filtered"."""
    phase = case.meta.phase.data if case.meta is not None else None
    location = getattr(phase, "parameter_location", None)
    if location == ParameterLocation.BODY:
        return None
    if location == ParameterLocation.QUERY and _sent_as_no_filter(case.query or {}, phase.parameter):
        return None
    return negative_data_rejection(ctx, response, case)


def _sent_as_no_filter(query, name):
    # django-filter reads an empty value as "this filter not given".
    values = query.get(name)
    values = values if isinstance(values, list) else [values]
    return name is not None and all(value in ("", None) for value in values)


# --checks all, but: positive_data_acceptance expects every schema-valid request to succeed, and
# no schema can say "an image that exists", "a start in the future", "an address that is an IP",
# so every write with rules would fail it by design; negative_data_rejection is narrowed above.
CHECKS_ALL = [
    check for check in CHECKS.get_all() if check not in {positive_data_acceptance, negative_data_rejection}
] + [negative_query_and_path_rejection]


JSON = "application/json"
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
SCHEMA_PATH = "/api/v1/schema/"


_served = {}  # this process's copy of the served schema


@pytest.fixture
def served_schema(db, settings, monkeypatch):
    """The schema the API serves, and the application that serves it."""
    settings.API_SCHEMA_ACCESS = "public"  # schemathesis reads the schema without credentials
    # The ignored-auth check repeats every case without credentials: hundreds of anonymous
    # calls a minute from one address, which the anonymous rate (120/min) would answer 429.
    monkeypatch.setattr(AnonThrottle, "THROTTLE_RATES", {"anon": "100000/min"})
    # As Django's test client does: a finished request must not close the test's connection.
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    app = get_wsgi_application()
    if "raw" not in _served:  # the same for every item: drf-spectacular builds it in about 2 s
        _served["raw"] = schemathesis.openapi.from_wsgi(SCHEMA_PATH, app).raw_schema
    yield copy.deepcopy(_served["raw"]), app
    for signal in (request_started, request_finished):
        signal.connect(close_old_connections)


def _loaded(raw, app):
    loaded = schemathesis.openapi.from_dict(raw)
    loaded.app, loaded.location = app, SCHEMA_PATH
    return loaded


def _operations(raw):
    for item in raw["paths"].values():
        for method in [method for method in item if method in METHODS]:
            yield item, method


def json_bodies(raw_schema):
    """A copy of the schema whose request bodies are JSON wherever JSON is accepted."""
    raw = copy.deepcopy(raw_schema)
    for item, method in _operations(raw):
        content = item[method].get("requestBody", {}).get("content", {})
        if JSON in content:
            item[method]["requestBody"]["content"] = {JSON: content[JSON]}
    return raw


def other_bodies(raw_schema):
    """A copy of the schema with the operations that take a body in another media type than
    JSON (form, multipart), in those media types only."""
    raw = copy.deepcopy(raw_schema)
    for item, method in list(_operations(raw)):
        content = item[method].get("requestBody", {}).get("content", {})
        others = {media: spec for media, spec in content.items() if media != JSON}
        if others:
            item[method]["requestBody"]["content"] = others
        else:
            del item[method]
    raw["paths"] = {path: item for path, item in raw["paths"].items() if any(m in item for m in METHODS)}
    return raw


@pytest.fixture
def api_schema(served_schema):
    """Every operation, its body in JSON: the coverage phase derives its hundreds of variants of
    each body once, in the media type integrations send, not once per media type."""
    raw, app = served_schema
    return _loaded(json_bodies(raw), app)


@pytest.fixture
def other_media_schema(served_schema):
    """The same bodies as forms and multipart: generated cases (the coverage phase's variants
    reach the same serializers through the JSON parser)."""
    raw, app = served_schema
    return _loaded(other_bodies(raw), app)


@pytest.fixture
def positive_api_schema(served_schema):
    """As ``api_schema``, its coverage phase deriving valid variants only (the plain user's)."""
    raw, app = served_schema
    loaded = _loaded(json_bodies(raw), app)
    loaded.config.phases.coverage.generation.update(modes=[GenerationMode.POSITIVE])
    return loaded


schema = schemathesis.pytest.from_fixture("api_schema")
positive = schemathesis.pytest.from_fixture("positive_api_schema")
other_media = schemathesis.pytest.from_fixture("other_media_schema")

#: Parts per persona. Enough that two workers end together; each part loads the schema once.
PARTS = 8


def deal(raw_schema):
    """``{operation label: part}``: the costliest operation first, each to the part with the
    least cost so far (deterministic: ties go to the lower part, then the label decides)."""
    costs = {
        f"{method.upper()} {path}": _cost(raw_schema, item, operation)
        for path, item in raw_schema["paths"].items()
        for method, operation in item.items()
        if method in METHODS
    }
    loads = [0] * PARTS
    parts = {}
    for label in sorted(costs, key=lambda label: (-costs[label], label)):
        part = loads.index(min(loads))
        parts[label] = part
        loads[part] += costs[label]
    return parts


def _cost(raw_schema, item, operation):
    # Schemathesis' coverage phase derives cases from every parameter, property and constraint
    # of the request, once per media type of the body: the size of that definition, references
    # resolved, follows the number of requests an operation gets.
    request = {
        "parameters": item.get("parameters", []) + operation.get("parameters", []),
        "body": operation.get("requestBody", {}),
    }
    return 1000 + len(json.dumps(_resolved(raw_schema, request, depth=0)))


def _resolved(raw_schema, value, depth):
    if depth > 8:  # a recursive definition counts its first levels only
        return None
    if isinstance(value, dict):
        if "$ref" in value:
            target = raw_schema
            for key in value["$ref"].removeprefix("#/").split("/"):
                target = target[key]
            return _resolved(raw_schema, target, depth + 1)
        return {key: _resolved(raw_schema, item, depth) for key, item in value.items()}
    if isinstance(value, list):
        return [_resolved(raw_schema, item, depth) for item in value]
    return value


_deals = {}


def in_part(part):
    def matches(ctx):
        raw = ctx.operation.schema.raw_schema
        if id(raw) not in _deals:
            _deals.clear()  # one schema at a time: an item loads its own
            _deals[id(raw)] = deal(raw)
        return _deals[id(raw)][ctx.operation.label] == part

    return matches


def bearer(user):
    return {"Authorization": f"Bearer {tokens.issue(user, 'fuzz', scopes='all')[1]}"}


@pytest.fixture
def admin_headers(admin_user):
    return bearer(admin_user)


@pytest.fixture
def plain_user_headers(alice):
    return bearer(alice)


def refused_to_a_plain_user(ctx):
    """Does a role the plain user (no role, not staff) lacks guard this operation?

    Read from the view's permission classes, as DRF checks them before it reads the request:
    whatever the input, the answer is 403 (the refused items assert that), so the input-deriving
    coverage phase would send the same refusal hundreds of times."""
    match = _resolved_view(ctx.operation.full_path)
    view = getattr(match.func, "cls", None)
    needs = "read" if ctx.operation.method.upper() in SAFE_METHODS else "write"
    return any(
        issubclass(permission, RoleRequired) and getattr(permission, needs) is not None
        for permission in getattr(view, "permission_classes", ())
    )


# A path parameter is an id or a UUID (uploads): the view behind a path is the same for any value.
PLACEHOLDERS = ("1", "00000000-0000-0000-0000-000000000000")


def _resolved_view(path):
    for value in PLACEHOLDERS:
        try:
            return resolve(re.sub(r"{[^}]+}", value, path))
        except Resolver404:
            continue
    raise LookupError(f"no view serves {path} with any of {PLACEHOLDERS}")


FUZZ = settings(max_examples=3, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
#: Generated cases only (schemathesis' coverage phase runs as hypothesis' explicit examples).
GENERATED_ONLY = settings(FUZZ, phases=[Phase.generate])


def fuzz_admin(part):
    @schema.include(in_part(part)).parametrize()
    @FUZZ
    def test_api_conforms_to_its_schema(case, admin_headers):
        case.call_and_validate(headers=admin_headers, checks=CHECKS_ALL)

    return test_api_conforms_to_its_schema


def fuzz_plain_user(part):
    @positive.include(in_part(part)).exclude(refused_to_a_plain_user).parametrize()
    @FUZZ
    def test_api_conforms_to_its_schema(case, plain_user_headers):
        case.call_and_validate(headers=plain_user_headers, checks=CHECKS_ALL)

    return test_api_conforms_to_its_schema


@schema.include(refused_to_a_plain_user).parametrize()
@GENERATED_ONLY
def test_a_plain_user_is_refused_what_a_role_guards_and_the_refusal_conforms(case, plain_user_headers):
    response = case.call_and_validate(headers=plain_user_headers, checks=CHECKS_ALL)
    # Refused (403); only what comes before any view may answer first: the router (404 for a
    # path or ``format`` it does not serve) and the guard against NUL in parameters (400).
    assert response.status_code in (400, 403, 404), (case.method, case.formatted_path, response.status_code)


@other_media.parametrize()
@GENERATED_ONLY
def test_form_and_multipart_bodies_conform_as_admin(case, admin_headers):
    case.call_and_validate(headers=admin_headers, checks=CHECKS_ALL)


@other_media.exclude(refused_to_a_plain_user).parametrize()
@GENERATED_ONLY
def test_form_and_multipart_bodies_conform_as_plain_user(case, plain_user_headers):
    case.call_and_validate(headers=plain_user_headers, checks=CHECKS_ALL)


for _part in range(PARTS):
    globals()[f"test_api_conforms_to_its_schema_as_admin_part_{_part}"] = fuzz_admin(_part)
    globals()[f"test_api_conforms_to_its_schema_as_plain_user_part_{_part}"] = fuzz_plain_user(_part)


def _ops(loaded):
    return [result.ok() for result in loaded.get_all_operations()]


def _media(operation):
    return operation.definition.raw.get("requestBody", {}).get("content", {})


def test_every_operation_is_fuzzed_in_exactly_one_part_per_persona(api_schema, other_media_schema, served_schema):
    def labels(filter_set):
        return [result.ok().label for result in api_schema.clone(filter_set=filter_set).get_all_operations()]

    everything = labels(api_schema.filter_set)
    as_admin = [label for part in range(PARTS) for label in labels(schema.include(in_part(part)).filter_set)]
    as_plain_user = [
        label
        for part in range(PARTS)
        for label in labels(schema.include(in_part(part)).exclude(refused_to_a_plain_user).filter_set)
    ]
    refused = labels(schema.include(refused_to_a_plain_user).filter_set)
    assert len(everything) > 100
    assert sorted(as_admin) == sorted(everything)
    assert sorted(as_plain_user + refused) == sorted(everything)
    # Every body is fuzzed in JSON with the coverage phase, and in each other media type it accepts.
    served, _ = served_schema
    bodied = {
        (f"{method.upper()} {path}", media)
        for path, item in served["paths"].items()
        for method, operation in item.items()
        if method in METHODS
        for media in operation.get("requestBody", {}).get("content", {})
    }
    in_json = {(op.label, media) for op in _ops(api_schema) for media in _media(op)}
    in_others = {(op.label, media) for op in _ops(other_media_schema) for media in _media(op)}
    assert in_json | in_others == bodied and not in_json & in_others
    assert {media for _, media in in_json} == {JSON} and len(in_others) > 50
    # The staff API (hosts, webhooks, quota rules …) is refused; a user's own things are not.
    assert "GET /api/v1/webhooks/" in refused and "POST /api/v1/reservations/" in as_plain_user
