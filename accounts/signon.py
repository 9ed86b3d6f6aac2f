"""Sign-on: the login page's methods, local accounts, and the LDAP / Active Directory backend.

Every password check goes through Django's ``authenticate`` with ``AUTHENTICATION_BACKENDS``
(the login page, the admin's and the RAPI's basic auth alike), so the lockout backend in front
counts directory failures as it counts local ones.

``DirectoryBackend`` is django-auth-ldap's backend plus what vclmgr needs:
- ``AUTH_LDAP_GROUP_MAP`` (accounts/ldap_config.py, applied by accounts/group_map.py): at every
  sign-in the user's groups named in the map are set from the directory; groups the map does
  not name (given by hand) stay. Quotas and image visibility follow Django groups, so they
  change at that sign-in.
- a directory account never takes over a local account of the same name (one with a usable
  password, such as the admin), nor one only other sign-on methods vouched for
  (``SignOnIdentity``): the sign-in is refused and logged. Each directory sign-in records the
  account as the directory's own.
- a failed sign-in changes no account. The directory retires (deactivates) only the accounts it
  made, when asked (``retire_gone``: ``manage.py ldap_retire``, or its schedule).
- a directory that does not answer is told apart from a wrong password (the login page says so).
- a session of a deactivated user ends at its next request (django-auth-ldap does not check).
"""

import logging

from django.conf import settings
from django.contrib.auth import forms as auth_forms
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Permission
from django.core.exceptions import ValidationError
from django.db.models import Value
from django_auth_ldap.backend import LDAPBackend, ldap_error

from accounts import access
from accounts.group_map import managed_groups, mapped_groups, normal_dn, set_mapped_groups
from core import changelog

log = logging.getLogger(__name__)

_DOWN_FLAG = "vclmgr_directory_down"
LDAP_ISSUER = "ldap"  # the one directory; its subjects are Django usernames


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
        if (
            user_obj.is_active
            and not user_obj.is_anonymous
            and obj is None
            and not user_obj.is_superuser
            and not any(hasattr(user_obj, name) for name in cached)
        ):
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
        refusal = None if built else claim_refusal(user, "ldap", LDAP_ISSUER)
        if refusal is not None:
            log.warning("LDAP sign-in as %s refused: %s", username, refusal)
            raise ldap_user.AuthenticationFailed(refusal)
        return user, built

    def authenticate_ldap_user(self, ldap_user, password):
        import ldap

        user = ldap_user.authenticate(password)
        if user is None or not user.is_active:
            return None
        bind_identity(user, "ldap", LDAP_ISSUER, user.username)
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


def claim_refusal(user, method, issuer):
    """Why a sign-on by ``method`` (``issuer``'s) may not use the existing ``user`` found by its
    name; None when it may. A local account (a usable password) is nobody's to take; one that
    another method or issuer vouched for is that one's. An account with no recorded origin (made
    before origins were recorded) is claimed by the first method that signs it in."""
    if user.has_usable_password():
        return "a local account has this name"
    identities = list(user.signon_identities.all())
    if identities and not any((i.method, i.issuer) == (method, issuer) for i in identities):
        # Bound to this method as well (an OIDC e-mail link to a directory account) is still its own.
        return f"the account belongs to {identities[0].get_method_display()} sign-on ({identities[0].issuer})"
    return None


def bind_identity(user, method, issuer, subject):
    """Record that ``method`` (``issuer``'s ``subject``) vouched for ``user`` (idempotent)."""
    from accounts.models import SignOnIdentity

    SignOnIdentity.objects.get_or_create(issuer=issuer, subject=subject, defaults={"user": user, "method": method})


def retire_gone():
    """Deactivate the active accounts the directory made whose entries it no longer has, so their
    sessions end and their API tokens stop too; returns their usernames.

    Run by ``manage.py ldap_retire`` (or its schedule), never by a sign-in: a failed password
    attempt is anyone's and changes no account. Only accounts with an LDAP origin, only in the
    search set-up (a direct bind cannot tell a missing entry from a wrong password), and only on
    an answer: the search base must exist, and an account is retired when the search for it
    succeeded with no entry. Any directory error stops the sweep with nothing more changed. An
    administrator reactivates the account if the person comes back."""
    import ldap
    from ldap.filter import escape_filter_chars

    from accounts.models import SignOnIdentity

    backend = DirectoryBackend()
    search = backend.settings.USER_SEARCH
    if not backend.settings.SERVER_URI or search is None or backend.settings.USER_DN_TEMPLATE:
        return []
    connection = _service_connection(backend)
    try:
        connection.search_s(search.base_dn, ldap.SCOPE_BASE, "(objectClass=*)", ["1.1"])  # NO_SUCH_OBJECT: stop
        retired = []
        made = SignOnIdentity.objects.filter(method="ldap", user__is_active=True).select_related("user")
        for identity in made.order_by("pk"):
            wanted = search.filterstr % {"user": escape_filter_chars(identity.subject)}
            if not connection.search_s(search.base_dn, search.scope, wanted, ["1.1"]):
                _retire(identity.user)
                retired.append(identity.user.username)
        return retired
    finally:
        connection.unbind_s()


def _service_connection(backend):
    import ldap

    config = backend.settings
    connection = ldap.initialize(config.SERVER_URI, bytes_mode=False)
    for option, value in config.CONNECTION_OPTIONS.items():
        connection.set_option(option, value)
    if config.START_TLS:
        connection.start_tls_s()
    connection.simple_bind_s(config.BIND_DN, config.BIND_PASSWORD)
    return connection


def _retire(user):
    user.is_active = False
    user.save(update_fields=["is_active"])
    changelog.record(
        user,
        "update",
        changelog.Actor(name="directory"),
        {"is_active": [True, False]},
        reason="no longer in the directory",
    )
    log.warning("%s is no longer in the directory: account deactivated (its tokens and sessions end)", user)


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


ldap_error.connect(_on_ldap_error, dispatch_uid="accounts.signon.directory_down")


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
