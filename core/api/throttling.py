"""API rate limits: per user, and per client address for every request no credentials
authenticated (no token, a bad token, no session) — counted before any permission check,
so a 401 never comes first and guessing tokens is rate-limited like any anonymous call.

The counters live in the ``throttle`` cache (Redis when configured). When it cannot be
reached, throttling fails open to this process's memory for ``RETRY_PRIMARY_SECONDS`` and
then tries again: a Redis outage must not turn every API call into a 500.
"""

import logging
import time

from django.core.cache import caches
from django.core.cache.backends.locmem import LocMemCache
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.throttling import SimpleRateThrottle, UserRateThrottle

log = logging.getLogger(__name__)

RETRY_PRIMARY_SECONDS = 30
_FALLBACK = LocMemCache("throttle-fallback", {})
_primary_down_until = 0.0


def _cache_down_errors():
    # Read only when something was raised: redis costs every process's start most of a half
    # second, and a process whose throttle cache is not Redis never needs it.
    try:
        from redis.exceptions import RedisError
    except ImportError:  # pragma: no cover - redis is a requirement
        return (OSError,)
    return (RedisError, OSError)


def _cache_down():
    global _primary_down_until
    if _primary_down_until == 0.0:  # once per outage, not once per request
        log.warning("the throttle cache is unreachable; throttling falls back to a local-memory cache")
    _primary_down_until = time.monotonic() + RETRY_PRIMARY_SECONDS


class _FailOpen:
    def allow_request(self, request, view):
        global _primary_down_until
        if _primary_down_until and time.monotonic() < _primary_down_until:
            self.cache = _FALLBACK
            return super().allow_request(request, view)
        try:
            allowed = super().allow_request(request, view)
        except _cache_down_errors():
            _cache_down()
            self.cache = _FALLBACK
            return super().allow_request(request, view)
        if _primary_down_until:
            log.warning("the throttle cache is reachable again")
            _primary_down_until = 0.0
        return allowed


class AnonThrottle(_FailOpen, SimpleRateThrottle):
    """Per client address; used only for requests that no credentials authenticated."""

    scope = "anon"
    cache = caches["throttle"]

    def get_cache_key(self, request, view):
        # Never reads request.user: it runs while authentication is still deciding.
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


class UserThrottle(_FailOpen, UserRateThrottle):
    cache = caches["throttle"]


def count_unauthenticated(request):
    """Count a request that no credentials authenticated; 429 once the address is over its rate."""
    throttle = AnonThrottle()
    if not throttle.allow_request(request, None):
        raise exceptions.Throttled(wait=throttle.wait())


class UnauthenticatedThrottle(BaseAuthentication):
    """Last of the authentication classes: reached only when no earlier one authenticated."""

    def authenticate(self, request):
        count_unauthenticated(request)
        return None
