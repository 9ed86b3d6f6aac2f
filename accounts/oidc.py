"""Single sign-on through OpenID Connect (mozilla-django-oidc), off unless ``OIDC_RP_CLIENT_ID``
is set.

mozilla-django-oidc has no discovery: every endpoint it reads (``OIDC_OP_*``) that the
environment left unset comes here from the provider's ``OIDC_OP_DISCOVERY_URL`` document,
fetched on first use and kept for the life of the process (a failed fetch is not kept, so the
next sign-in tries again). An endpoint set explicitly always wins over the document.

The library leaves the ID token's audience and issuer unchecked, and lets PyJWT's other
refusals (expired, not yet valid, malformed) through as server errors; ``Backend.verify_token``
refuses a token whose ``aud`` is not our client or whose ``iss`` is not ``OIDC_OP_ISSUER``
(else the discovered issuer), and turns those into refusals too. A callback whose state this
session is not waiting for (replayed: the state is spent at its first use; or begun in another
browser) is refused by ``CallbackView`` before any call to the provider; a code the provider
will not exchange (used already) is the provider's refusal. Every refusal (bad signature,
nonce, audience, issuer, expiry, replay, provider unreachable) is logged and signs nobody in —
no user is created; the login page says the provider does not
answer when it did not, that the sign-in failed otherwise.

An account is bound to the provider's (issuer, ``sub``) — a ``SignOnIdentity`` row — and found
by it alone: the same person is the same account whatever their ``preferred_username`` or
e-mail becomes, and a provider's user never becomes the account of a namesake made by LDAP,
SAML or by hand. A subject seen for the first time gets a new account named after its
``preferred_username`` (else ``sub``), with ``-2``, ``-3``… when another account has that name
in any case (django-allauth's way). Only with ``OIDC_LINK_VERIFIED_EMAIL`` (off by default) is
it bound instead to the one existing account of its e-mail, when the provider says
``email_verified`` is true, the account has no password and no other subject of this provider.
Names, e-mail and the groups named by ``OIDC_GROUP_MAP`` (claim value → group) are refreshed at
each sign-in; groups outside that map (given by hand) are left alone.
"""

import logging
import threading

import jwt
import requests
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.db import transaction
from django.shortcuts import redirect, resolve_url
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from accounts.group_map import managed_groups, mapped_groups, set_mapped_groups
from accounts.signon import bind_identity

log = logging.getLogger("accounts.oidc")

# Our setting → the field of the discovery document (OpenID Connect Discovery 1.0, §3).
DISCOVERED = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
    "OIDC_OP_LOGOUT_ENDPOINT": "end_session_endpoint",
}
_document = {}
_lock = threading.Lock()
_DOWN_FLAG = "vclmgr_oidc_provider_down"


class ProviderUnavailable(Exception):
    """The provider's discovery document could not be read (a retry may help)."""


def discovery():
    """The provider's discovery document ({} without ``OIDC_OP_DISCOVERY_URL``)."""
    url = settings.OIDC_OP_DISCOVERY_URL
    if not url:
        return {}
    with _lock:
        if url not in _document:
            try:
                response = requests.get(url, timeout=settings.OIDC_TIMEOUT, verify=settings.OIDC_VERIFY_SSL)
                response.raise_for_status()
                document = response.json()
            except (requests.RequestException, ValueError) as exc:
                raise ProviderUnavailable(f"cannot read {url}: {exc}") from exc
            if not isinstance(document, dict):
                raise ProviderUnavailable(f"{url}: not a discovery document")
            _document[url] = document
        return _document[url]


def forget_discovery():
    with _lock:
        _document.clear()


def get_setting(attr, *default):
    """mozilla-django-oidc's settings, with unset endpoints taken from the discovery document."""
    value = import_from_settings(attr, *default) if default else getattr(settings, attr, None)
    if value is None and attr in DISCOVERED:
        value = discovery().get(DISCOVERED[attr])
        if value is None and not default:
            raise ImproperlyConfigured(f"{attr} is not set and the provider's discovery document has no value")
    return value


def issuer():
    """The issuer ID tokens must carry: ``OIDC_OP_ISSUER``, else the discovered one."""
    return settings.OIDC_OP_ISSUER or discovery().get("issuer")


def _claim_values(claims):
    value = claims.get(settings.OIDC_GROUPS_CLAIM)
    if value is None:
        return set()
    if isinstance(value, str):
        return {value}
    if isinstance(value, list):
        return {str(item) for item in value}
    return set()


class Backend(OIDCAuthenticationBackend):
    """Claims → user and groups; refusals logged (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        # Unlike the library, resolve nothing here: Django builds a backend for every request
        # of a signed-in user (get_user), which must not need the provider.
        from django.contrib.auth import get_user_model

        self.UserModel = get_user_model()

    get_settings = staticmethod(get_setting)

    OIDC_OP_TOKEN_ENDPOINT = property(lambda self: get_setting("OIDC_OP_TOKEN_ENDPOINT"))
    OIDC_OP_USER_ENDPOINT = property(lambda self: get_setting("OIDC_OP_USER_ENDPOINT"))
    OIDC_OP_JWKS_ENDPOINT = property(lambda self: get_setting("OIDC_OP_JWKS_ENDPOINT", None))
    OIDC_RP_CLIENT_ID = property(lambda self: settings.OIDC_RP_CLIENT_ID)
    OIDC_RP_CLIENT_SECRET = property(lambda self: settings.OIDC_RP_CLIENT_SECRET)
    OIDC_RP_SIGN_ALGO = property(lambda self: settings.OIDC_RP_SIGN_ALGO)
    OIDC_RP_IDP_SIGN_KEY = None

    def authenticate(self, request, **kwargs):
        if request is None or "code" not in request.GET:
            return None
        try:
            return super().authenticate(request, **kwargs)
        except SuspiciousOperation as exc:
            log.warning("OIDC sign-in refused from %s: %s", request.META.get("REMOTE_ADDR"), exc)
        except (requests.RequestException, ProviderUnavailable, ImproperlyConfigured) as exc:
            response = getattr(exc, "response", None)
            if response is not None and 400 <= response.status_code < 500:  # it answered: no
                log.warning(
                    "OIDC sign-in from %s refused by the provider: %s %s",
                    request.META.get("REMOTE_ADDR"),
                    exc,
                    response.text[:200],
                )
            else:
                log.error("OIDC sign-in failed, the provider did not answer properly: %s", exc)
                setattr(request, _DOWN_FLAG, True)
        return None

    def verify_token(self, token, **kwargs):
        try:
            payload = super().verify_token(token, **kwargs)
        except jwt.PyJWTError as exc:  # the library turns only a bad signature into a refusal
            raise SuspiciousOperation(f"ID token refused: {exc}") from exc
        if kwargs.get("nonce") is None:
            return payload  # the userinfo answer as a JWT: no aud/iss of an ID token to check
        audience = payload.get("aud")
        audiences = [audience] if isinstance(audience, str) else list(audience or [])
        if settings.OIDC_RP_CLIENT_ID not in audiences:
            raise SuspiciousOperation(f"ID token for another audience: {audiences!r}")
        if len(audiences) > 1 and payload.get("azp") != settings.OIDC_RP_CLIENT_ID:
            raise SuspiciousOperation(f"ID token authorised for another party: {payload.get('azp')!r}")
        if payload.get("iss") != issuer():
            raise SuspiciousOperation(f"ID token from another issuer: {payload.get('iss')!r}")
        return payload

    def get_userinfo(self, access_token, id_token, payload):
        claims = super().get_userinfo(access_token, id_token, payload)
        # OpenID Connect Core §5.3.2: the answer may be about another user; only sub says.
        if claims.get("sub") != payload.get("sub"):
            raise SuspiciousOperation("the userinfo answer is about another subject than the ID token")
        return claims

    def get_username(self, claims):
        return str(claims.get("preferred_username") or claims["sub"])[:150]

    def verify_claims(self, claims):
        if not claims.get("sub"):
            raise SuspiciousOperation("the provider gave no sub")
        return True

    def describe_user_by_claims(self, claims):
        return f"subject {claims.get('sub')} of {issuer()}"

    def filter_users_by_claims(self, claims):
        bound = self.UserModel.objects.filter(
            signon_identities__method="oidc",
            signon_identities__issuer=issuer(),
            signon_identities__subject=str(claims["sub"]),
        )
        return bound if bound.exists() else self._by_verified_email(claims)

    def _by_verified_email(self, claims):
        """The one account to link by e-mail (``OIDC_LINK_VERIFIED_EMAIL``), or []."""
        email = claims.get("email")
        if not (settings.OIDC_LINK_VERIFIED_EMAIL and email and claims.get("email_verified") is True):
            return []
        found = list(self.UserModel.objects.filter(email__iexact=email)[:2])
        if len(found) != 1:
            if found:
                log.warning(
                    "OIDC sign-in of %s: %s is on several accounts, linked to none",
                    self.describe_user_by_claims(claims),
                    email,
                )
            return []
        user, refusal = found[0], None
        if user.has_usable_password():
            refusal = "a local account"
        elif user.signon_identities.filter(method="oidc", issuer=issuer()).exists():
            refusal = "bound to another subject of this provider"
        if refusal is not None:
            log.warning(
                "OIDC sign-in of %s: %s has %s, not linked (%s)",
                self.describe_user_by_claims(claims),
                user.username,
                email,
                refusal,
            )
            return []
        log.info("OIDC sign-in of %s: linked to %s by its verified e-mail", self.describe_user_by_claims(claims), user)
        return [user]

    @transaction.atomic
    def create_user(self, claims):
        user = self.UserModel(username=self._free_username(self.get_username(claims)))
        user.set_unusable_password()
        return self.update_user(user, claims, created=True)

    def _free_username(self, wanted):
        """``wanted``, or ``wanted-2``, ``-3``…: the name of another account (whatever its case)
        is never reused, so a provider's user never becomes a namesake's account."""
        name, n = wanted, 1
        while self.UserModel.objects.filter(username__iexact=name).exists():
            n += 1
            name = f"{wanted[: 150 - len(str(n)) - 1]}-{n}"
        if name != wanted:
            log.info("OIDC sign-in: the username %s is taken, the new account is %s", wanted, name)
        return name

    @transaction.atomic
    def update_user(self, user, claims, created=False):
        user.email = claims.get("email") or user.email
        user.first_name = (claims.get("given_name") or user.first_name)[:150]
        user.last_name = (claims.get("family_name") or user.last_name)[:150]
        user.save()
        bind_identity(user, "oidc", issuer(), str(claims["sub"]))
        # The claim's values through the group map every sign-on method shares (accounts/group_map.py).
        group_map = {settings.OIDC_GROUPS_CLAIM: settings.OIDC_GROUP_MAP}
        granted = mapped_groups(group_map, set(), {settings.OIDC_GROUPS_CLAIM: sorted(_claim_values(claims))})
        set_mapped_groups(user, granted, managed=managed_groups(group_map), source="OIDC")
        log.info("OIDC sign-in: %s %s, groups %s", "created" if created else "updated", user.username, sorted(granted))
        return user


class RequestView(OIDCAuthenticationRequestView):
    """The redirect to the provider; an unreachable provider is a message on the login page."""

    get_settings = staticmethod(get_setting)

    def __init__(self, *args, **kwargs):
        # The endpoint is resolved in get(), where a failure can be answered.
        super(OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID

    def get(self, request):
        try:
            self.OIDC_OP_AUTH_ENDPOINT = get_setting("OIDC_OP_AUTHORIZATION_ENDPOINT")
        except (ProviderUnavailable, ImproperlyConfigured) as exc:
            log.error("OIDC sign-in unavailable: %s", exc)
            messages.error(request, f"{settings.OIDC_PROVIDER_NAME} does not answer; try again later.")
            return redirect(settings.LOGIN_URL)
        return super().get(request)


class CallbackView(OIDCAuthenticationCallbackView):
    get_settings = staticmethod(get_setting)

    @property
    def failure_url(self):
        return resolve_url(settings.LOGIN_URL)

    def get(self, request):
        state = request.GET.get("state")
        if "code" in request.GET and state is not None and state not in request.session.get("oidc_states", {}):
            # The library answers a spent state with a 400 and an unknown one silently.
            log.warning(
                "OIDC callback refused from %s: not an answer to a sign-in this session started "
                "(replayed, or begun elsewhere)",
                request.META.get("REMOTE_ADDR"),
            )
            return self.login_failure()
        return super().get(request)

    def login_failure(self):
        if getattr(self.request, _DOWN_FLAG, False):
            messages.error(self.request, f"{settings.OIDC_PROVIDER_NAME} does not answer; try again later.")
        else:
            messages.error(self.request, f"Sign-in with {settings.OIDC_PROVIDER_NAME} failed.")
        return super().login_failure()
