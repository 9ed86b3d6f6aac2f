"""Sign-in lockout (django-axes): after ``LOGIN_FAILURE_LIMIT`` wrong passwords for one
username from one address, that pair is refused (429) for ``LOGIN_COOLOFF_MINUTES``, even
with the right password — on ``/login/`` and ``/admin/login/`` alike."""

from axes.backends import AxesStandaloneBackend
from django.conf import settings


class LockoutBackend(AxesStandaloneBackend):
    """Axes' backend, minus its refusal of calls without a request: those come from code
    (the test client, management commands), never from someone guessing over HTTP."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
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
