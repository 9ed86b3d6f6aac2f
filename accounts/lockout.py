"""Sign-in lockout (django-axes): after ``LOGIN_FAILURE_LIMIT`` wrong passwords for one
username from one address, that pair is refused (429) for ``LOGIN_COOLOFF_MINUTES``, even
with the right password — on ``/login/`` and ``/admin/login/`` alike. Each refusal from a
locked-out pair is logged (``accounts.lockout``, WARNING) with the username and address."""

import logging

from axes.backends import AxesStandaloneBackend
from django.conf import settings

log = logging.getLogger(__name__)


class LockoutBackend(AxesStandaloneBackend):
    """Axes' backend, minus its refusal of calls without a request: those come from code
    (the test client, management commands), never from someone guessing over HTTP."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        # Sign-on callbacks (OpenID Connect) carry no username: their failures are logged by
        # accounts/oidc.py, and counting them per address would lock a whole campus NAT out.
        if request is None or username is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


def client_address(request):
    """The address the lockout counts, read as DRF's throttles read it (``NUM_PROXIES``)."""
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR")
    proxies = settings.TRUSTED_PROXIES
    if proxies and forwarded:
        hops = [hop.strip() for hop in forwarded.split(",")]
        return hops[-min(proxies, len(hops))]
    return request.META.get("REMOTE_ADDR")


def log_lockout(sender, request, username, ip_address, **kwargs):
    """axes' ``user_locked_out``: one line an operator can act on (whom to unlock, or block).

    axes logs lockouts too, but masks the username and address (``AXES_SENSITIVE_PARAMETERS``,
    lest a password typed into the username field reach the log); a lockout needs the same
    username ``LOGIN_FAILURE_LIMIT`` times, so it is an account name, and %r keeps control
    characters out of the log."""
    log.warning(
        "sign-in refused, locked out: username %r from %s on %s after %s wrong passwords (for %s)",
        (username or "")[:150],
        ip_address,
        getattr(request, "path", "?"),
        getattr(request, "axes_failures_since_start", "repeated"),
        settings.AXES_COOLOFF_TIME,
    )
