"""Single sign-on through SAML 2.0 (Shibboleth and other campus IdPs) with djangosaml2, off
unless the IdP's metadata is configured (accounts/saml_config.py).

What vclmgr adds to djangosaml2:
- ``sp_config``: the pysaml2 configuration is loaded once and kept for ``SAML_METADATA_REFRESH``
  seconds (djangosaml2 would reload it, remote metadata included, at every request). A failed
  fetch of remote metadata keeps the last good copy; without one, sign-in says the IdP does not
  answer. The SP's own metadata (``/saml2/metadata/``) needs no IdP.
- ``Backend``: a user is found by username (eduPersonPrincipalName by default), never by e-mail;
  a local account with a password is never taken over, nor one LDAP, OpenID Connect or another
  IdP made (``SignOnIdentity``); an account the IdP signs in is recorded as its own. Names and e-mail
  (``SAML_ATTRIBUTE_MAPPING``) and the groups of ``SAML_GROUP_MAP`` (accounts/group_map.py, the
  map LDAP uses) are set at every sign-in, so quotas and image visibility follow at once.
- refusals (bad signature, another audience, a replayed or unsolicited response, an expired
  assertion, no user) are logged with the reason and the client's address, and end on the
  login page with a message; nobody is signed in and no user is created.
- the IdP's logout requests end only a SAML session; unreadable ones are a 400 (``LogoutView``).
- sign-out (the site's "Log out", a POST) of a SAML session also signs out at the IdP (single
  logout) where its metadata offers it; the hand-over to the IdP is a page that moves on by
  itself, because a browser applies the CSP's ``form-action 'self'`` to a form's redirects.
"""

import copy
import logging
import threading
import time

from django.conf import settings
from django.contrib import messages
from django.db import DatabaseError, transaction
from django.http import HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.urls import path
from djangosaml2 import views as saml_views
from djangosaml2.backends import Saml2Backend
from saml2.config import SPConfig
from saml2.metadata import entity_descriptor

from accounts.group_map import managed_groups, mapped_groups, set_mapped_groups
from accounts.signon import bind_identity, claim_refusal

log = logging.getLogger("accounts.saml")

_config = {}
_lock = threading.Lock()


class IdPUnavailable(Exception):
    """The IdP's metadata could not be loaded (a retry may help)."""


def sp_config(request=None):
    """djangosaml2's config loader (``SAML_CONFIG_LOADER``): the cached pysaml2 configuration."""
    with _lock:
        loaded = _config.get("sp")
        if loaded is not None and time.monotonic() - loaded[0] < settings.SAML_METADATA_REFRESH:
            return loaded[1]
        try:
            conf = SPConfig().load(copy.deepcopy(settings.SAML_CONFIG))
        except Exception as exc:  # requests, XML and pysaml2 errors alike
            if loaded is not None:
                log.error("SAML: cannot refresh the IdP metadata, keeping the last copy: %s", exc)
                _config["sp"] = (time.monotonic(), loaded[1])
                return loaded[1]
            raise IdPUnavailable(f"cannot load the IdP metadata: {exc}") from exc
        _config["sp"] = (time.monotonic(), conf)
        return conf


def forget_config():
    with _lock:
        _config.clear()


def signed_on(request):
    """Whether this session came from a SAML sign-in (it can end with a single logout)."""
    session = getattr(request, "saml_session", None)
    return session is not None and saml_views._get_subject_id(session) is not None


class Backend(Saml2Backend):
    def get_or_create_user(self, user_lookup_key, user_lookup_value, create_unknown_user, **kwargs):
        user, created = super().get_or_create_user(user_lookup_key, user_lookup_value, create_unknown_user, **kwargs)
        refusal = None if user is None or created else claim_refusal(user, "saml", kwargs["idp_entityid"])
        if refusal is not None:
            log.warning("SAML sign-in as %s refused: %s", user_lookup_value, refusal)
            return None, False
        return user, created

    def clean_user_main_attribute(self, main_attribute):
        if main_attribute is not None and len(str(main_attribute)) > 150:
            log.warning("SAML sign-in refused: the username %r is longer than 150 characters", main_attribute)
            return None
        return main_attribute

    def authenticate(self, request, session_info=None, attribute_mapping=None, **kwargs):
        if session_info is None:
            return None  # a password sign-in: not ours
        with transaction.atomic():
            user = super().authenticate(
                request, session_info=session_info, attribute_mapping=attribute_mapping, **kwargs
            )
            if user is None:
                return None
            bind_identity(user, "saml", session_info["issuer"], user.username)
            group_map = settings.SAML_GROUP_MAP
            if group_map:
                wanted = mapped_groups(group_map, set(), session_info.get("ava", {}))
                set_mapped_groups(user, wanted, managed=managed_groups(group_map), source="SAML")
        log.info("SAML sign-in of %s from %s", user.username, session_info.get("issuer"))
        return user


def _unavailable(request, exc):
    log.error("SAML sign-in unavailable: %s", exc)
    messages.error(request, f"{settings.SAML_PROVIDER_NAME} does not answer; try again later.")
    return redirect(settings.LOGIN_URL)


class LoginView(saml_views.LoginView):
    def get(self, request, *args, **kwargs):
        try:
            self.get_sp_config(request)
        except IdPUnavailable as exc:
            return _unavailable(request, exc)
        return super().get(request, *args, **kwargs)


class AssertionConsumerServiceView(saml_views.AssertionConsumerServiceView):
    def post(self, request, *args, **kwargs):
        try:
            self.get_sp_config(request)
        except IdPUnavailable as exc:
            return _unavailable(request, exc)
        return super().post(request, *args, **kwargs)

    def handle_acs_failure(self, request, exception=None, status=403, **kwargs):
        reason = f"{type(exception).__name__}: {exception}" if exception is not None else "unknown"
        log.warning("SAML sign-in refused from %s: %s", request.META.get("REMOTE_ADDR"), reason)
        messages.error(request, f"Sign-in with {settings.SAML_PROVIDER_NAME} failed.")
        return redirect(settings.LOGIN_URL)


class LogoutInitView(saml_views.LogoutInitView):
    """Single logout, started by the site's sign-out form (POST, CSRF-checked)."""

    def post(self, request, *args, **kwargs):
        response = self.get(request, *args, **kwargs)
        if response.status_code == 400:
            # The IdP offers no single logout for this session: the local sign-out is done.
            return redirect(settings.LOGOUT_REDIRECT_URL)
        if response.status_code in (301, 302):
            return render(
                request,
                "registration/saml_logout.html",
                {"next_url": response["Location"], "provider": settings.SAML_PROVIDER_NAME},
            )
        return response


def logout(request):
    """The sign-out of a SAML session (accounts/signon.py's LogoutView hands it over)."""
    try:
        sp_config(request)
    except IdPUnavailable as exc:
        log.error("SAML single logout skipped: %s", exc)
        return None
    return LogoutInitView.as_view()(request)


class LogoutView(saml_views.LogoutView):
    """The IdP's single-logout endpoint (its requests, its answers to ours). A logout request
    from a browser whose session is not a SAML sign-in changes nothing (djangosaml2 ended that
    session: any site could link here), and a message pysaml2 cannot read is a 400, not a 500."""

    def do_logout_service(self, request, data, binding, *args, **kwargs):
        if "SAMLRequest" in data and not signed_on(request):
            return _logout_refused(request, "not a session from a SAML sign-in")
        try:
            return super().do_logout_service(request, data, binding, *args, **kwargs)
        except DatabaseError:
            raise
        except Exception as exc:  # pysaml2's, XML and encoding errors alike
            return _logout_refused(request, f"{type(exc).__name__}: {exc}")


def _logout_refused(request, reason):
    log.warning("SAML logout request refused from %s: %s", request.META.get("REMOTE_ADDR"), reason)
    return HttpResponseBadRequest("This sign-out request cannot be used.")


class MetadataView(saml_views.MetadataView):
    """The SP's metadata for the IdP's operators: from our own settings, with no IdP needed."""

    def get(self, request, *args, **kwargs):
        conf = SPConfig().load({**copy.deepcopy(settings.SAML_CONFIG), "metadata": {}})
        return self.response_class(str(entity_descriptor(conf)).encode(), content_type="text/xml; charset=utf-8")

    response_class = saml_views.HttpResponse


urlpatterns = [
    path("login/", LoginView.as_view(), name="saml2_login"),
    path("acs/", AssertionConsumerServiceView.as_view(), name="saml2_acs"),
    path("ls/", LogoutView.as_view(), name="saml2_ls"),
    path("ls/post/", LogoutView.as_view(), name="saml2_ls_post"),
    path("metadata/", MetadataView.as_view(), name="saml2_metadata"),
]
