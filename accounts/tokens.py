"""API tokens: issue, resolve and revoke. The only place that sees a token in clear."""

import hashlib
import logging
import secrets

from django.db import transaction
from django.utils import timezone

from accounts import access
from accounts.models import ApiToken
from core import reconnect

log = logging.getLogger(__name__)

TOKEN_PREFIX = "vcl_"  # noqa: S105 (a marker, not a secret)


def digest(token):
    return hashlib.sha256(token.encode()).hexdigest()


@transaction.atomic
def issue(user, name, scopes=("read",), expires=None):
    """Create a token; returns (row, clear_token). The clear token is never stored. Scopes are
    kept in ``access.SCOPES`` order; ``read`` is always among them; ``"all"`` means every scope
    the user's roles allow now."""
    if scopes == "all":
        scopes = access.allowed_scopes(user)
    unknown = set(scopes) - set(access.SCOPES)
    if unknown:
        raise ValueError(f"unknown scopes {sorted(unknown)}")
    beyond = set(scopes) - access.allowed_scopes(user) - {"read"}
    if beyond:  # a token never has more than its user
        raise ValueError(f"{user} may not have a token with {sorted(beyond)}")
    clear = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken.objects.create(
        user=user,
        name=name,
        prefix=clear[: len(TOKEN_PREFIX) + 6],
        digest=digest(clear),
        scopes=[scope for scope in access.SCOPES if scope in {"read", *scopes}],
        expires=expires,
    )
    return row, clear


def resolve(clear):
    """The live token row for a clear token, or None (unknown, expired or inactive user)."""
    if not clear or not clear.startswith(TOKEN_PREFIX) or len(clear) > 100:
        return None
    row = ApiToken.objects.select_related("user").filter(digest=digest(clear)).first()
    now = timezone.now()
    if row is None or not row.user.is_active or (row.expires and row.expires <= now):
        if row is not None:  # the prefix only: never the token
            log.warning("API token %s… (%r) of %s refused: expired or user inactive", row.prefix, row.name, row.user)
        return None
    if row.last_used is None or (now - row.last_used).total_seconds() > 60:
        # Throttled so a busy integration doesn't turn every read into a write.
        with reconnect.repeatable():
            ApiToken.objects.filter(pk=row.pk).update(last_used=now)
    return row


def is_live(token_id):
    """Is this token still usable (not revoked, not expired, its user active)?"""
    now = timezone.now()
    return ApiToken.objects.filter(pk=token_id, user__is_active=True).exclude(expires__lte=now).exists()


def revoke(user, token_id):
    deleted, _ = ApiToken.objects.filter(user=user, pk=token_id).delete()
    return deleted > 0
