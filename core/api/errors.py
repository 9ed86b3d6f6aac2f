"""One JSON error format for the whole API.

    {"error": {"status": 400, "code": "invalid", "message": "…", "fields": {"name": ["…"]}}}

A service's ``core.errors.Conflict`` (``InUse`` too) is answered here, and only here, with
409 ``conflict`` and its message: views let it through. ``Upstream`` (a BMC that refused or
did not answer) is 502 ``upstream``.
``fields`` appears for validation errors only; nested serializer errors are flattened to
dotted paths (``disks.0.size``).
"""

import logging

from django.core.exceptions import BadRequest, RequestDataTooBig, SuspiciousOperation
from django.db import OperationalError
from django.http import HttpResponse, JsonResponse
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError, ValidationError
from rest_framework.views import exception_handler as drf_exception_handler

from core.api.exceptions import TooLarge
from core.errors import Conflict, Upstream

log = logging.getLogger(__name__)
RETRY_AFTER_SECONDS = 2
# PostgreSQL's "too many connections" and "cannot connect now" (server starting or stopping).
_OVERLOAD_SQLSTATES = {"53300", "57P03"}


class UpstreamError(APIException):
    status_code = status.HTTP_502_BAD_GATEWAY
    default_code = "upstream"
    default_detail = "A system vclmgr drives did not answer."


class ConflictError(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"
    default_detail = "Conflict with the current state."


def error_body(status, code, message, fields=None):
    error = {"status": status, "code": code, "message": message}
    if fields:
        error["fields"] = fields
    return {"error": error}


def _flatten(detail, prefix=""):
    if isinstance(detail, dict):
        out = {}
        for key, value in detail.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    if isinstance(detail, list) and detail and all(isinstance(i, (dict, list)) for i in detail):
        out = {}
        for index, value in enumerate(detail):
            out.update(_flatten(value, f"{prefix}{index}."))
        return out
    messages = [str(m) for m in detail] if isinstance(detail, list) else [str(detail)]
    return {prefix.rstrip(".") or "non_field_errors": messages}


def exception_handler(exc, context):
    if isinstance(exc, Upstream):
        exc = UpstreamError(str(exc) or None)
    elif isinstance(exc, Conflict):
        exc = ConflictError(str(exc) or None)
    elif isinstance(exc, RequestDataTooBig):
        exc = TooLarge(str(exc) or None)
    elif isinstance(exc, (SuspiciousOperation, BadRequest)):  # Django's refusals of a malformed request
        exc = ParseError(str(exc) or None)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, ValidationError):
        fields = _flatten(response.data)
        first = next(iter(fields.items()))
        message = first[1][0] if first[0] == "non_field_errors" else f"{first[0]}: {first[1][0]}"
        response.data = error_body(response.status_code, "invalid", message, fields)
    else:
        detail = getattr(exc, "detail", None)
        code = getattr(detail, "code", None) or getattr(exc, "default_code", "error")
        message = str(detail) if detail else str(getattr(exc, "default_detail", "")) or "Error."
        response.data = error_body(response.status_code, str(code), message)
    return response


class ApiJsonErrorsMiddleware:
    """Under /api/, an error that escaped DRF (404 of an unknown URL, a crash) is JSON too."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path.startswith("/api/") and (refused := _nul_parameters(request)):
            # PostgreSQL cannot compare text with NUL in it (a 500 deep in a filter); say which.
            fields = {name: ["Null characters are not allowed."] for name in refused}
            return JsonResponse(
                error_body(400, "invalid", f"{refused[0]}: Null characters are not allowed.", fields), status=400
            )
        response = self.get_response(request)
        if (
            request.path.startswith("/api/")
            and response.status_code >= 400
            and not response.get("Content-Type", "").startswith("application/json")
        ):
            status = response.status_code
            message = {404: "Not found.", 405: "Method not allowed.", 403: "Forbidden."}.get(status, "Error.")
            return JsonResponse(error_body(status, "error", message), status=status)
        return response

    def process_exception(self, request, exception):
        if is_overload(exception):
            return overloaded(request)
        if not request.path.startswith("/api/"):
            return None
        log.exception("unhandled API error on %s %s", request.method, request.path)
        return JsonResponse(error_body(500, "server_error", "Internal server error."), status=500)


def _nul_parameters(request):
    return sorted(
        {
            name.replace("\x00", "\\0")
            for name, values in request.GET.lists()
            if "\x00" in name or any("\x00" in value for value in values)
        }
    )


def is_overload(exc):
    """The database has no connection for us now (pool exhausted, server full): try again soon."""
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__
    if type(cause).__name__ == "PoolTimeout":  # psycopg_pool, without importing it on SQLite
        return True
    return getattr(cause, "sqlstate", None) in _OVERLOAD_SQLSTATES


def overloaded(request):
    """503 with Retry-After: a full database is a reason to come back, never a server error."""
    log.warning("overloaded: no database connection for %s %s", request.method, request.path)
    message = "The service is busy; retry shortly."
    if request.path.startswith("/api/"):
        response = JsonResponse(error_body(503, "overloaded", message), status=503)
    else:
        response = HttpResponse(message, status=503, content_type="text/plain; charset=utf-8")
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response
