"""Bearer-token authentication for the REST API and websockets."""

from channels.db import database_sync_to_async
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from vclmgr import tokens
from vclmgr.api.throttling import count_unauthenticated


def _bearer(header_value):
    parts = header_value.split()
    if len(parts) == 2 and parts[0].lower() in {"bearer", "token"}:
        return parts[1]
    return None


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer vcl_…``; sets ``request.auth`` to the token row."""

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        clear = _bearer(header)
        if clear is None:
            count_unauthenticated(request)
            raise exceptions.AuthenticationFailed("Malformed Authorization header; use 'Bearer <token>'.")
        row = tokens.resolve(clear)
        if row is None:
            count_unauthenticated(request)
            raise exceptions.AuthenticationFailed("Invalid or expired token.")
        return row.user, row

    def authenticate_header(self, request):
        return 'Bearer realm="api"'


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = ApiTokenAuthentication
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer"}


class TokenWebsocketMiddleware:
    """Lets integrations open websockets with an ``Authorization: Bearer`` header."""

    def __init__(self, inner):
        self.inner = inner

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers", []))
        header = headers.get(b"authorization", b"").decode("latin-1")
        clear = _bearer(header) if header else None
        if clear:
            row = await database_sync_to_async(tokens.resolve)(clear)
            if row is not None:
                scope = {**scope, "user": row.user}
        return await self.inner(scope, receive, send)
