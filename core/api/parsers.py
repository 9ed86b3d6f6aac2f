"""Request body parsers that refuse a hostile body with a 4xx before it costs the server.

- JSON: at most ``API_MAX_BODY_BYTES`` bytes and ``API_MAX_JSON_DEPTH`` levels of nesting, both
  checked on the raw bytes before ``json`` (recursive) sees them — a body nested 50,000 levels
  deep would otherwise end in a RecursionError (a 500). A NUL character in any string is refused
  with the path of the value (PostgreSQL cannot store it in text or jsonb), on every database so
  the API behaves the same everywhere.
- Forms and multipart: Django's own limits (``DATA_UPLOAD_MAX_NUMBER_FIELDS``, …) answer 400
  (413 for size) in the one error format instead of escaping as server errors.
"""

import codecs
import json
import re
from contextlib import contextmanager

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.http import QueryDict
from rest_framework import parsers
from rest_framework.exceptions import ParseError, ValidationError

from core.api.exceptions import TooLarge

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")
NUL_MESSAGE = "Null characters are not allowed."


def check_depth(raw, limit):
    """ParseError when the JSON text ``raw`` nests arrays/objects deeper than ``limit``."""
    depth = 0
    for match in _BRACKET.finditer(_STRING.sub(b'""', raw)):
        if match.group() in b"[{":
            depth += 1
            if depth > limit:
                raise ParseError(f"JSON nested deeper than {limit} levels (API_MAX_JSON_DEPTH)")
        else:
            depth -= 1


def nul_paths(value, prefix=""):
    """Dotted paths (``params.name``, ``rows.3.address``) of the strings in ``value`` holding NUL."""
    if isinstance(value, str):
        return [prefix or "non_field_errors"] if "\x00" in value else []
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return []
    found = []
    for key, item in items:
        path = f"{prefix}.{key}" if prefix else str(key)
        if "\x00" in str(key):
            found.append(path.replace("\x00", "\\0"))
        else:
            found.extend(nul_paths(item, path))
    return found


def _read_limited(stream, limit, request):
    declared = request.META.get("CONTENT_LENGTH") if request is not None else None
    if declared and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"the request body is over {limit:,} bytes (API_MAX_BODY_BYTES)")
    raw = stream.read(limit + 1)
    if len(raw) > limit:
        raise TooLarge(f"the request body is over {limit:,} bytes (API_MAX_BODY_BYTES)")
    return raw


class JSONParser(parsers.JSONParser):
    def max_bytes(self):
        return settings.API_MAX_BODY_BYTES

    def parse(self, stream, media_type=None, parser_context=None):
        parser_context = parser_context or {}
        raw = _read_limited(stream, self.max_bytes(), parser_context.get("request"))
        check_depth(raw, settings.API_MAX_JSON_DEPTH)
        encoding = parser_context.get("encoding", settings.DEFAULT_CHARSET)
        try:
            text = codecs.decode(raw, encoding)
            data = json.loads(text, parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        if "\\u0000" in text:  # the only way a NUL gets into parsed JSON: a cheap test first
            paths = nul_paths(data)
            if paths:
                raise ValidationError({path: [NUL_MESSAGE] for path in paths})
        return data


class ImportJSONParser(JSONParser):
    """For bulk imports, whose body may carry a whole file as text (escaped: up to twice as long)."""

    def max_bytes(self):
        return 2 * settings.INVENTORY_IMPORT_MAX_BYTES


def _refuse_constant(name):
    raise ValueError(f"{name} is not a JSON value")


class FormParser(parsers.FormParser):
    def parse(self, stream, media_type=None, parser_context=None):
        parser_context = parser_context or {}
        # Django bounds request.body (DATA_UPLOAD_MAX_MEMORY_SIZE), not the stream DRF reads.
        raw = _read_limited(stream, settings.API_MAX_BODY_BYTES, parser_context.get("request"))
        with _form_limits():
            return QueryDict(raw, encoding=parser_context.get("encoding", settings.DEFAULT_CHARSET))


class MultiPartParser(parsers.MultiPartParser):
    def parse(self, stream, media_type=None, parser_context=None):
        with _form_limits():
            return super().parse(stream, media_type, parser_context)


@contextmanager
def _form_limits():
    """Django's form limits (too many fields or files, too large) → 400/413, never a 500."""
    try:
        yield
    except RequestDataTooBig as exc:
        raise TooLarge(f"the request body is too large: {exc}") from None
    except (SuspiciousOperation, ValueError) as exc:  # ValueError: urllib's "Max number of fields exceeded"
        raise ParseError(f"form parse error - {exc}") from None
