"""Ganeti RAPI's wire protocol: who is asking, what they sent, and the error body.

- Authentication: HTTP basic against vclmgr's users (the sign-in lockout applies), or an API
  token — as the basic password (the username must be its owner's) or ``Authorization:
  Bearer vcl_…``. Every resource needs a signed-in user; writes need staff and, for a token,
  a write-enabled one. Requests no credentials authenticate count against the API's
  anonymous rate, signed-in ones against the per-user rate, as on ``/api/v1``.
- Bodies are JSON (also on GET: ``/2/jobs/ID/wait``), with ``Content-Type: application/json``;
  a plain string or number is a body too (Ganeti's node role).
- Errors are Ganeti's ``{"code": 400, "message": "…", "explain": "…"}`` (``explain`` is the
  status's standard description, as Ganeti's HTTP server gives).
"""

import base64
import binascii
import http
import json
import logging
from functools import wraps

from django.conf import settings
from django.contrib.auth import authenticate
from django.core.exceptions import RequestDataTooBig, ValidationError
from django.http import HttpResponse
from django.utils.cache import add_never_cache_headers
from django.views.decorators.csrf import csrf_exempt
from rest_framework import serializers
from rest_framework.exceptions import ParseError, Throttled

from accounts import access, tokens
from core.api.errors import is_overload
from core.api.parsers import check_depth, nul_paths
from core.api.throttling import UserThrottle, count_unauthenticated
from core.errors import Conflict

log = logging.getLogger(__name__)
REALM = "Ganeti Remote API"
WRITE_METHODS = ("PUT", "POST", "DELETE")


class RapiError(Exception):
    """An answer other than 200: ``code`` and a message for the client."""

    def __init__(self, code, message=None, headers=None):
        super().__init__(message or http.HTTPStatus(code).phrase)
        self.code, self.message, self.headers = code, message or http.HTTPStatus(code).phrase, headers or {}


def bad_request(message):
    return RapiError(400, message)


def json_response(data, status=200, headers=None):
    response = HttpResponse(json.dumps(data), status=status, content_type="application/json")
    for name, value in (headers or {}).items():
        response[name] = value
    add_never_cache_headers(response)  # per-user answers: never kept by a browser or proxy
    return response


def error_response(error):
    status = http.HTTPStatus(error.code)
    body = {"code": error.code, "message": error.message, "explain": status.description}
    return json_response(body, status=error.code, headers=error.headers)


class Request:
    """What a resource handler gets: the user, the token (or None), the query and the body."""

    def __init__(self, django_request, user, token, body):
        self.django = django_request
        self.user, self.token, self.body = user, token, body
        self.method = django_request.method
        self.query = django_request.GET

    def flag(self, name):
        """A bool query argument: ``1``/``0`` (Ganeti's ``bulk``, ``dry-run``, ``force``)."""
        value = self.query.get(name, "0") or "0"
        try:
            return bool(int(value))
        except ValueError:
            raise bad_request(f"Invalid value for the '{name}' parameter") from None

    def text(self, name):
        values = self.query.getlist(name)
        if values and "\x00" in values[0]:  # PostgreSQL stores no NUL (a 500 there): refused everywhere
            raise bad_request(f"Null characters are not allowed in the '{name}' parameter")
        return values[0] if values else None

    @property
    def reason(self):
        return self.text("reason") or ""


def _credentials(request):
    """``(user, token)`` for the Authorization header; (None, None) without one."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    if not header:
        return None, None
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer":
        row = tokens.resolve(value.strip())
        return (row.user, row) if row else _refuse(request, "Invalid or expired token")
    if scheme.lower() != "basic":
        return _refuse(request, "Use HTTP basic authentication (or a bearer token)")
    try:
        username, _, password = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return _refuse(request, "Malformed basic credentials")
    if password.startswith(tokens.TOKEN_PREFIX):
        row = tokens.resolve(password)
        if row is None or row.user.get_username() != username:
            return _refuse(request, "Invalid or expired token, or not this user's")
        return row.user, row
    user = authenticate(request, username=username, password=password)
    if user is None:
        if getattr(request, "axes_locked_out", False):
            # Refused here in Ganeti's format; unflagged, the lockout middleware would answer
            # in its own, which Ganeti's client cannot read.
            request.axes_locked_out = False
            raise RapiError(429, "Too many failed sign-ins for this user from this address; try again later")
        return _refuse(request, "Wrong username or password")
    return user, None


def _refuse(request, message):
    count_unauthenticated(request)
    raise RapiError(401, message, {"WWW-Authenticate": f'Basic realm="{REALM}"'})


def _content_type(request):
    return request.META.get("CONTENT_TYPE", "").split(";")[0].strip().lower()


def _body(request):
    try:
        raw = request.body
    except RequestDataTooBig:
        raise RapiError(413, f"The request body is over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE:,} bytes") from None
    if not raw:
        return None
    if _content_type(request) != "application/json":
        raise RapiError(415, "Request bodies must be application/json")
    try:
        check_depth(raw, settings.API_MAX_JSON_DEPTH)
    except ParseError as exc:
        raise bad_request(str(exc.detail)) from None
    try:
        data = json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        raise bad_request("Unable to parse JSON data") from None
    if nul_paths(data):  # PostgreSQL stores no NUL: refused alike on every database
        raise bad_request(f"Null characters are not allowed (in {nul_paths(data)[0]})")
    return data


def _refuse_constant(name):
    raise ValueError(f"{name} is not a JSON value")


def _authorise(request, user, token, write):
    if user is None:
        count_unauthenticated(request)
        raise RapiError(401, "Authentication required", {"WWW-Authenticate": f'Basic realm="{REALM}"'})
    if not UserThrottle().allow_request(_Throttled(user, request), None):
        raise RapiError(429, "Too many requests; slow down")
    if write and not access.can(user, "operate"):
        raise RapiError(403, "Only operators may change the cluster")
    if write and token is not None and not access.token_has(token, "operate", f"RAPI {request.method} {request.path}"):
        raise RapiError(403, "This token does not carry the operate scope")


class _Throttled:
    """What DRF's user throttle reads of a request (the user, and META for anonymous idents)."""

    def __init__(self, user, request):
        self.user, self.META = user, request.META


def resource(reads=(), **handlers):
    """A view answering the given methods (``GET=fn``…), each ``fn(rapi_request, **url_args)``.

    The handler returns the JSON value to answer with 200, or raises ``RapiError``. A method
    the resource lacks is 501, as Ganeti answers; writes need staff, except the methods in
    ``reads`` (Ganeti's ``PUT /2/query``: a read that carries its filter in a body).
    """

    @csrf_exempt  # no cookies are read here: only credentials sent with each request
    @wraps(next(iter(handlers.values())))
    def view(request, **kwargs):
        try:
            handler = handlers.get(request.method)
            user, token = _credentials(request)
            _authorise(request, user, token, write=request.method in WRITE_METHODS and request.method not in reads)
            if handler is None:
                raise RapiError(501, f"Method {request.method} is unsupported for path {request.path}")
            if request.method in WRITE_METHODS and _content_type(request) != "application/json":
                # A browser holding basic credentials sends them cross-site too; only a JSON
                # content type forces its CORS preflight (which is never granted), so an
                # empty-bodied form POST cannot evacuate a node. Ganeti's client always sends it.
                raise RapiError(415, "Writes must be sent with Content-Type: application/json")
            return json_response(handler(Request(request, user, token, _body(request)), **kwargs))
        except RapiError as error:
            return error_response(error)
        except Throttled as exc:
            return error_response(RapiError(429, str(exc.detail), {"Retry-After": str(int(exc.wait or 1))}))
        except (ValidationError, serializers.ValidationError) as exc:
            return error_response(bad_request(first_message(exc)))
        except Conflict as exc:
            return error_response(RapiError(409, str(exc)))
        except Exception as exc:
            if is_overload(exc):
                return error_response(RapiError(503, "The service is busy; retry shortly", {"Retry-After": "2"}))
            log.exception("unhandled RAPI error on %s %s", request.method, request.path)
            return error_response(RapiError(500, "Internal server error"))

    return view


def first_message(exc):
    """'field: message' of a service's refusal (Django's or DRF's ValidationError), flattened."""
    detail = exc.message_dict if hasattr(exc, "error_dict") else getattr(exc, "detail", None) or exc.messages
    path = []
    while isinstance(detail, (dict, list)) and detail:
        if isinstance(detail, dict):
            key = next(iter(detail))
            if key not in ("__all__", "non_field_errors"):
                path.append(str(key))
            detail = detail[key]
        else:
            detail = detail[0]
    return f"{'.'.join(path)}: {detail}" if path else str(detail)


def not_found(request, rest=""):
    return error_response(RapiError(404))
