"""A request body field the endpoint does not know is refused with 400 naming it, everywhere."""

import pytest
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.settings import spectacular_settings
from rest_framework import serializers

from core.api.serializers import RefuseUnknownFields


def request_serializers():
    generator = SchemaGenerator()
    generator._initialise_endpoints()
    for path, _, method, view in generator._get_paths_and_endpoints():
        if method not in {"POST", "PUT", "PATCH"}:
            continue
        view.request = spectacular_settings.GET_MOCK_REQUEST(method, path, view, None)
        declared = view.schema.get_request_serializer()
        for serializer in declared.values() if isinstance(declared, dict) else [declared]:
            if isinstance(serializer, serializers.ListSerializer):
                serializer = serializer.child
            if serializer is not None:
                yield f"{method} {path}", serializer if isinstance(serializer, type) else type(serializer)


def test_every_request_serializer_refuses_unknown_fields(db):
    lax = sorted(
        {f"{where}: {cls.__name__}" for where, cls in request_serializers() if not issubclass(cls, RefuseUnknownFields)}
    )
    assert not lax, "request serializers without RefuseUnknownFields:\n" + "\n".join(lax)


@pytest.mark.parametrize(
    ("url", "body"),
    [
        ("/api/v1/reservations/", {"image": 1, "duration_minutes": 60, "duraton": 5}),
        ("/api/v1/jobs/", {"opcode": "noop", "prio": 5}),
        ("/api/v1/jobs/batch/", {"jobs": [{"opcode": "noop", "prio": 5}]}),
        ("/api/v1/vms/", {"image": 1, "mem": 5}),
    ],
)
def test_it_refuses_an_unknown_field_naming_it(db, api, alice, url, body):
    response = api(alice).post(url, body, format="json")
    assert response.status_code == 400, response.content[:300]
    fields = response.json()["error"]["fields"]
    assert any(key.split(".")[-1] in {"duraton", "prio", "mem"} for key in fields), fields
