"""Bearer-token authentication for the REST API and websockets."""

from channels.db import database_sync_to_async
from django.contrib.auth.models import AnonymousUser
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from accounts import tokens
from core.api.throttling import count_unauthenticated


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
    """Websockets authenticate one of two ways, and only cookies need the Origin check.

    A browser sends its session cookie to a socket opened by any page, so cookie sessions go
    through ``cookie_app`` (the Origin check, then the session). No page can set a socket's
    ``Authorization`` header, so a bearer token is proof enough and integrations need send no
    Origin. A request that carries the header is never let fall back to the cookie: a wrong
    token is anonymous. ``scope["api_token_id"]`` lets the consumer notice a revoke.
    """

    def __init__(self, token_app, cookie_app):
        self.token_app = token_app
        self.cookie_app = cookie_app

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers", []))
        header = headers.get(b"authorization", b"").decode("latin-1")
        if not header:
            return await self.cookie_app(scope, receive, send)
        clear = _bearer(header)
        row = await database_sync_to_async(tokens.resolve)(clear) if clear else None
        if row is None:
            scope = {**scope, "user": AnonymousUser()}
        else:
            scope = {**scope, "user": row.user, "api_token_id": row.pk}
        return await self.token_app(scope, receive, send)
