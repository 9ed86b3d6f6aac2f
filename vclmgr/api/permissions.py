from django.conf import settings
from rest_framework import permissions

from vclmgr.models import ApiToken


def unsupported_method(request, view):
    """A method the view does not offer: let it through, so DRF answers 405 rather than 403."""
    method = request.method.lower()
    return method not in view.http_method_names or not hasattr(view, method)


def token_allows(request):
    """A read-only token may only read, whatever the user could otherwise do."""
    if isinstance(request.auth, ApiToken) and not request.auth.write_enabled:
        return request.method in permissions.SAFE_METHODS
    return True


class IsAuthenticatedWithTokenScope(permissions.IsAuthenticated):
    message = "This token is read-only."

    def has_permission(self, request, view):
        return super().has_permission(request, view) and token_allows(request)


class IsStaffWithTokenScope(permissions.BasePermission):
    """Administrators only (``is_staff``)."""

    def has_permission(self, request, view):
        user = request.user
        if user and user.is_authenticated and unsupported_method(request, view):
            return True
        return bool(user and user.is_authenticated and user.is_staff and token_allows(request))


class IsStaffOrReadOnly(permissions.BasePermission):
    """Any signed-in user may read; only administrators may write."""

    def has_permission(self, request, view):
        user = request.user
        if not (user and user.is_authenticated and token_allows(request)):
            return False
        return request.method in permissions.SAFE_METHODS or user.is_staff or unsupported_method(request, view)


class SchemaAccess(permissions.BasePermission):
    """Who may read the API schema and docs: ``API_SCHEMA_ACCESS`` = public, users or staff."""

    def has_permission(self, request, view):
        access = settings.API_SCHEMA_ACCESS
        if access == "public":
            return True
        user = request.user
        return bool(user and user.is_authenticated and (access == "users" or user.is_staff))
