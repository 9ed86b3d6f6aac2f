"""Sign-on: the login page's methods, local accounts, and the LDAP / Active Directory backend.

Every password check goes through Django's ``authenticate`` with ``AUTHENTICATION_BACKENDS``
(the login page, the admin's and the RAPI's basic auth alike), so the lockout backend in front
counts directory failures as it counts local ones.

``DirectoryBackend`` is django-auth-ldap's backend plus what vclmgr needs:
- ``AUTH_LDAP_GROUP_MAP`` (vclmgr/ldap_config.py, applied by vclmgr/group_map.py): at every
  sign-in the user's groups named in the map are set from the directory; groups the map does
  not name (given by hand) stay. Quotas and image visibility follow Django groups, so they
  change at that sign-in.
- a directory account never takes over a local account of the same name (one with a usable
  password, such as the admin): the sign-in is refused and logged.
- a directory that does not answer is told apart from a wrong password (the login page says so).
- a session of a deactivated user ends at its next request (django-auth-ldap does not check).
"""

import logging

from django.conf import settings
from django.contrib.auth import forms as auth_forms
from django.contrib.auth import get_user_model
from django.contrib.auth import views as auth_views
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Permission
from django.core.exceptions import ValidationError
from django.db.models import Value
from django_auth_ldap.backend import LDAPBackend, ldap_error

from vclmgr import access, changelog
from vclmgr.group_map import managed_groups, mapped_groups, normal_dn, set_mapped_groups

log = logging.getLogger(__name__)

_DOWN_FLAG = "vclmgr_directory_down"


def methods():
    """The ways to sign in the login page offers, in order (the template loops over them)."""
    found = []
    if getattr(settings, "AUTH_LDAP_SERVER_URI", None):
        found.append({"kind": "ldap", "on_form": True, "label": settings.AUTH_LDAP_LOGIN_LABEL})
    # Redirecting methods (OpenID Connect, later SAML) are a button each, from settings.
    return found + [{"kind": "redirect", "on_form": False, **method} for method in settings.SIGN_ON_METHODS]


class LocalBackend(ModelBackend):
    """Django's ``ModelBackend`` reading a user's own and groups' permissions in one statement
    (a UNION ALL) instead of two: every reservation asks ``access.can`` once."""

    def get_all_permissions(self, user_obj, obj=None):
        cached = ("_perm_cache", "_user_perm_cache", "_group_perm_cache")
        if (user_obj.is_active and not user_obj.is_anonymous and obj is None and not user_obj.is_superuser
                and not any(hasattr(user_obj, name) for name in cached)):  # fmt: skip
            _read_permissions(user_obj)
        return super().get_all_permissions(user_obj, obj)


def _read_permissions(user):
    """Fill ``ModelBackend``'s two caches on ``user`` (its own, its groups') from one query."""
    names = ("source", "content_type__app_label", "codename")
    own = Permission.objects.filter(user=user).annotate(source=Value("user")).values_list(*names).order_by()
    held = Permission.objects.filter(group__user=user).annotate(source=Value("group")).values_list(*names).order_by()
    found = {"user": set(), "group": set()}
    for source, app_label, codename in own.union(held, all=True):
        found[source].add(f"{app_label}.{codename}")
    user._user_perm_cache, user._group_perm_cache = found["user"], found["group"]


class StaffOnlyModelBackend(LocalBackend):
    """Local accounts for staff only (``LOCAL_LOGIN_STAFF_ONLY``): everyone else signs on."""

    def user_can_authenticate(self, user):
        return super().user_can_authenticate(user) and access.is_admin(user)


class DirectoryBackend(LDAPBackend):
    def get_user(self, user_id):
        user = super().get_user(user_id)
        return user if user is not None and user.is_active else None

    def get_or_build_user(self, username, ldap_user):
        user, built = super().get_or_build_user(username, ldap_user)
        if not built and user.has_usable_password():
            log.warning("LDAP sign-in as %s refused: a local account has this name", username)
            raise ldap_user.AuthenticationFailed("a local account has this name")
        return user, built

    def authenticate_ldap_user(self, ldap_user, password):
        import ldap

        user = ldap_user.authenticate(password)
        if user is None:
            retire_if_gone(ldap_user)
            return None
        if not user.is_active:
            return None
        group_map = getattr(settings, "AUTH_LDAP_GROUP_MAP", {})
        if not group_map:
            return user
        try:
            wanted = mapped_groups(group_map, _group_dns(ldap_user), ldap_user.attrs or {})
        except ldap.LDAPError as exc:
            # Out-of-date groups would grant what the directory took away: refuse instead.
            log.warning("LDAP sign-in of %s refused: its groups could not be read (%s)", user, exc)
            _flag_if_down(ldap_user._request, exc)
            return None
        set_mapped_groups(user, wanted, managed=managed_groups(group_map), source="LDAP")
        return user


def retire_if_gone(ldap_user):
    """A directory-made account whose entry the directory no longer has is deactivated at this
    sign-in attempt, so its sessions end and its API tokens stop too (not only the password).
    Only when the user search answered "no such entry": a wrong password, a direct-bind set-up
    (where a missing entry and a wrong password look alike) or a directory error change nothing.
    An administrator reactivates the account if the person comes back."""
    import ldap

    search = ldap_user.settings.USER_SEARCH
    if search is None or ldap_user.settings.USER_DN_TEMPLATE is not None or ldap_user._user_dn is not None:
        return
    local = get_user_model().objects.filter(username__iexact=ldap_user._username, is_active=True).first()
    if local is None or local.has_usable_password():  # a local account is not the directory's
        return
    try:
        found = search.execute(ldap_user.connection, {"user": ldap_user._username})
    except ldap.LDAPError:
        return
    if found:
        return
    local.is_active = False
    local.save(update_fields=["is_active"])
    changelog.record(local, "update", changelog.Actor(name="directory"), {"is_active": [True, False]},
                     reason="no longer in the directory")  # fmt: skip
    log.warning("%s is no longer in the directory: account deactivated (its tokens and sessions end)", local)


def _group_dns(ldap_user):
    if getattr(settings, "AUTH_LDAP_GROUP_SEARCH", None) is None:
        return set()
    return {normal_dn(dn) for dn in ldap_user.group_dns}


def _flag_if_down(request, exc):
    import ldap

    if request is not None and isinstance(exc, (ldap.SERVER_DOWN, ldap.TIMEOUT, ldap.CONNECT_ERROR)):
        setattr(request, _DOWN_FLAG, True)


def _on_ldap_error(sender, context, user, request, exception, **kwargs):
    _flag_if_down(request, exception)


ldap_error.connect(_on_ldap_error, dispatch_uid="vclmgr.signon.directory_down")


class LoginForm(auth_forms.AuthenticationForm):
    error_messages = {
        **auth_forms.AuthenticationForm.error_messages,
        "invalid_login": "Your user name and password didn't match. Please try again.",
        "directory_down": (
            "The campus directory is not answering, so campus accounts cannot sign in right now. "
            "Please try again in a few minutes."
        ),
    }

    def clean(self):
        try:
            return super().clean()
        except ValidationError:
            if getattr(self.request, _DOWN_FLAG, False):
                raise ValidationError(self.error_messages["directory_down"], code="directory_down") from None
            raise


class LoginView(auth_views.LoginView):
    authentication_form = LoginForm
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        return super().get_context_data(sign_on_methods=methods(), **kwargs)


class LogoutView(auth_views.LogoutView):
    """Sign-out; a session from a SAML sign-in also signs out at the IdP (vclmgr/saml.py)."""

    def post(self, request, *args, **kwargs):
        if settings.SAML_ENABLED:
            from vclmgr import saml

            if saml.signed_on(request):
                response = saml.logout(request)
                if response is not None:
                    return response
        return super().post(request, *args, **kwargs)
