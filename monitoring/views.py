"""/metrics: the Prometheus text, for a bearer token or an allowed network (never for anyone);
the dashboard's panels as JSON."""

import hmac
import ipaddress

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from accounts import access
from accounts.lockout import client_address
from monitoring import dashboard, metrics


def _networks():
    return [ipaddress.ip_network(net, strict=False) for net in settings.METRICS_ALLOWED_NETWORKS]


def _from_allowed_network(request):
    try:
        address = ipaddress.ip_address(client_address(request) or "")
    except ValueError:
        return False
    return any(address in net for net in _networks())


def _refusal(request):
    """None when the scrape may proceed, else the response saying why not."""
    token = settings.METRICS_TOKEN
    if _from_allowed_network(request):
        return None
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer "):
        if hmac.compare_digest(header[7:].strip().encode(), token.encode()):
            return None
        return HttpResponse("wrong metrics token\n", status=403, content_type="text/plain")
    if token:
        response = HttpResponse("a bearer token is required\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(
        "metrics are off here: set METRICS_TOKEN or METRICS_ALLOWED_NETWORKS\n", status=403, content_type="text/plain"
    )


@require_GET
def metrics_view(request):
    refused = _refusal(request)
    if refused is not None:
        return refused
    return HttpResponse(metrics.render(), content_type=metrics.CONTENT_TYPE)


@login_required
def dashboard_data(request):
    """The dashboard's panels as JSON, for staff only (dashboard.js refetches it on events)."""
    if not access.can(request.user, "see_cluster"):
        raise PermissionDenied
    response = JsonResponse(dashboard.gather())
    response["Cache-Control"] = "no-store"
    return response
