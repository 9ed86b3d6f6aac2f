"""The API's permission classes: each asks ``accounts.access`` (roles) and the token's scopes.

A read needs the token scope ``read``; a write needs the view's ``write_scope`` (``run`` unless
the view says otherwise: ``reserve`` for reservations and blocks, ``operate`` for the cluster,
``admin`` for administration).
"""

from django.conf import settings
from rest_framework import permissions

from accounts import access


def unsupported_method(request, view):
    """A method the view does not offer: let it through, so DRF answers 405 rather than 403."""
    method = request.method.lower()
    return method not in view.http_method_names or not hasattr(view, method)


def is_read(request):
    return request.method in permissions.SAFE_METHODS


def scope_for(request, view, default="run"):
    return "read" if is_read(request) else getattr(view, "write_scope", default)


def token_allows(request, view=None, default="run"):
    """Does the request's token (if any) carry the scope this request needs?"""
    return access.token_permits(request, scope_for(request, view, default), f"{request.method} {request.path}")


class IsAuthenticatedWithTokenScope(permissions.IsAuthenticated):
    """Any signed-in user (the objects they see are filtered by the view)."""

    message = "This token does not carry the scope this request needs."

    def has_permission(self, request, view):
        return super().has_permission(request, view) and token_allows(request, view)


class RoleRequired(permissions.BasePermission):
    """``read`` / ``write``: the capability a read / a write needs (None: any signed-in user);
    ``scope``: the token scope a write needs unless the view sets ``write_scope``."""

    read = None
    write = access.ADMIN
    scope = "admin"

    @property
    def message(self):
        return "Your role does not allow this, or this token does not carry the scope it needs."

    def has_permission(self, request, view):
        user = request.user
        if not (user and user.is_authenticated):
            return False
        if unsupported_method(request, view):
            return True
        needed = self.read if is_read(request) else self.write
        if needed is not None and not access.can(user, needed):
            return False
        return token_allows(request, view, self.scope)


def role_required(*, read=None, write=access.ADMIN, scope="admin"):
    return type(f"RoleRequired_{read}_{write}_{scope}", (RoleRequired,), {"read": read, "write": write, "scope": scope})


#: administrators only, reads included (webhooks, quota rules, usage …)
IsStaffWithTokenScope = role_required(read=access.ADMIN, write=access.ADMIN, scope="admin")
#: any signed-in user reads; administrators write
IsStaffOrReadOnly = role_required(read=None, write=access.ADMIN, scope="admin")
#: the operator pages' API: operators and auditors read, operators write
OperatorOrAuditor = role_required(read="see_cluster", write="operate", scope="operate")
#: read everything (users' data): auditors and administrators; writes are administrators'
AuditorOrAdmin = role_required(read="see_all", write=access.ADMIN, scope="admin")


class SchemaAccess(permissions.BasePermission):
    """Who may read the API schema and docs: ``API_SCHEMA_ACCESS`` = public, users or staff."""

    def has_permission(self, request, view):
        schema_access = settings.API_SCHEMA_ACCESS
        if schema_access == "public":
            return True
        user = request.user
        return bool(user and user.is_authenticated and (schema_access == "users" or access.can(user, "see_cluster")))
