"""LTI 1.3: every verb of the tool, behind its admin, API, CLI and views.

Platforms (``lti_tool.LtiRegistration`` with its deployments) are registered, changed and removed
here; the tool's RSA keys (``lti_tool.Key``) are made and rotated here, their private halves
stored encrypted, and only their public halves ever leave (``jwks``, ``key_rows``): no verb
returns or logs a private key.

A launch (``launch``) is django-lti's and PyLTI1p3's validation — state cookie, nonce, the
platform's signature against its key set, expiry, issuer, client id (the audience), deployment,
message — plus what the libraries leave open: a deployment an administrator did not register is
refused (django-lti would make an inactive one), an ID token is used once (PyLTI1p3 would accept
the same form posted again while its nonce lives), and only resource-link launches with a
context are taken. Every refusal raises ``LaunchRefused`` (a status and the reason shown on the
error page) before anything is written; an accepted launch writes its user, its course group and
the membership in one transaction.

Who a launch is: the account an earlier launch of this platform's subject used; else the one a
sign-on method bound to the same issuer's subject (``accounts.SignOnIdentity``); else, with
``LTI_LINK_BY_EMAIL`` (off by default), the one account of the launch's e-mail that holds no
role, has no password and no other sign-on identity (``_by_email``); else a new account without
a password. An administrator's account (staff, superuser) is never signed in by a launch, however
it was found. Its course is the context's own group (``LtiCourse``), made at the context's first
launch. The Instructor role (of the context, LIS v2) makes the user an instructor
(accounts.access role); every launch makes them a member of the group.

Roster sync (``sync_roster``) asks the platform's Names and Role Provisioning Service for the
context's members, with an access token got with a client assertion signed by the tool's key.
Members are added (accounts made as a launch would, their membership of the context recorded
as a launch records it), and the group's members that this course vouched for (a launch in its
context or an earlier sync of its roster) and the roster no longer lists are removed; members
added by hand stay.
"""

import hashlib
import logging
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit

import jwt
import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone
from jwcrypto.jwk import JWK
from lti_tool.lti_core.constants import ContextRole
from lti_tool.lti_core.utils import normalize_role
from lti_tool.models import Key, LtiContext, LtiDeployment, LtiLaunch, LtiMembership, LtiRegistration, LtiUser
from lti_tool.utils import DjangoToolConfig, sync_data_from_launch
from pylti1p3.contrib.django import DjangoCacheDataStorage, DjangoMessageLaunch, DjangoOIDCLogin
from pylti1p3.deployment import Deployment
from pylti1p3.exception import LtiException, LtiServiceException, OIDCException
from pylti1p3.names_roles import NamesRolesProvisioningService
from pylti1p3.registration import Registration
from pylti1p3.service_connector import ServiceConnector

from accounts import access
from accounts.models import SignOnIdentity
from accounts.signon import bind_identity
from core import changelog
from core.errors import Conflict
from inventory import crypto
from lti.models import LtiCourse, SpentToken

log = logging.getLogger("lti")

CONTEXT = "https://purl.imsglobal.org/spec/lti/claim/context"
NRPS = "https://purl.imsglobal.org/spec/lti-nrps/claim/namesroleservice"
ROLES = "https://purl.imsglobal.org/spec/lti/claim/roles"
EXT = "https://purl.imsglobal.org/spec/lti/claim/ext"
PLATFORM_FIELDS = ("name", "issuer", "client_id", "audience", "keyset_url", "auth_url", "token_url", "is_active")


class LaunchRefused(Exception):
    """A launch or login initiation refused: ``status`` (400 or 403, 502 when the platform did
    not answer) and ``reason``, what the error page says."""

    def __init__(self, reason, status=403):
        super().__init__(reason)
        self.reason = reason
        self.status = status


class TimeoutSession(requests.Session):
    """Every call to a platform gives up after ``LTI_TIMEOUT_SECONDS`` (PyLTI1p3 sets none)."""

    def request(self, *args, **kwargs):
        kwargs.setdefault("timeout", settings.LTI_TIMEOUT_SECONDS)
        return super().request(*args, **kwargs)


class ToolConfig(DjangoToolConfig):
    """django-lti's look-ups, except that an unknown or inactive deployment is refused, not
    made (inactive) on the fly: only the deployments an administrator registered launch; and
    the registration carries the tool's private key decrypted (``pylti_registration``)."""

    def find_registration_by_issuer(self, iss, *args, **kwargs):
        return self.find_registration_by_params(iss, None)

    def find_registration_by_params(self, iss, client_id, *args, **kwargs):
        found = LtiRegistration.objects.active().filter(issuer=iss)
        self.registration = found.filter(client_id=client_id).first() if client_id is not None else None
        return pylti_registration(self.registration) if self.registration else None

    def find_deployment(self, iss, deployment_id):
        return self.find_deployment_by_params(iss, deployment_id, None)

    def find_deployment_by_params(self, iss, deployment_id, client_id, *args, **kwargs):
        found = LtiDeployment.objects.active().filter(
            registration__issuer=iss, registration__is_active=True, deployment_id=deployment_id
        )
        if client_id is not None:
            found = found.filter(registration__client_id=client_id)
        self.deployment = found.select_related("registration").first()
        if self.deployment is None:
            return None
        return Deployment().set_deployment_id(deployment_id)


# --- the tool's keys --------------------------------------------------------------------
# django-lti keeps a key's private half as PEM text; vclmgr stores it encrypted (Fernet, the
# CREDENTIAL_KEY of hypervisor credentials: inventory/crypto.py) and decrypts it only to sign.
# A key django-lti made itself (its own `rotate_keys` command) is PEM and still works.


def _generate_key():
    made = JWK.generate(kty="RSA", size=2048)
    private = made.export_to_pem(private_key=True, password=None).decode()
    return Key.objects.create(public_key=made.export_to_pem().decode(), private_key=crypto.encrypt(private))


def _private_pem(key):
    stored = key.private_key
    return stored if stored.startswith("-----BEGIN") else crypto.decrypt(stored)


def ensure_key():
    """The newest active key, made if there is none (a platform needs one to verify us)."""
    return Key.objects.active().order_by("-datetime_created", "-pk").first() or _generate_key()


def pylti_registration(registration):
    """PyLTI1p3's view of a platform, with the newest active key to sign (django-lti's
    ``to_registration`` without the per-registration static keys, which vclmgr never sets)."""
    made = Registration()
    made.set_auth_login_url(registration.auth_url)
    made.set_auth_token_url(registration.token_url)
    made.set_client_id(registration.client_id)
    made.set_key_set_url(registration.keyset_url)
    made.set_issuer(registration.issuer)
    if registration.audience:
        made.set_auth_audience(registration.audience)
    key = ensure_key()
    made.set_tool_private_key(_private_pem(key))
    made.set_tool_public_key(key.public_key)
    return made


def jwks():
    """The tool's public keys (every active one: a platform may still hold a token signed with
    the previous one)."""
    return Key.objects.as_jwks()


def key_rows():
    """Each key's public facts: kid, active, created (never the private half)."""
    return [
        {"kid": key.as_jwk()["kid"], "is_active": key.is_active, "created": key.datetime_created}
        for key in Key.objects.order_by("-datetime_created", "-pk")
    ]


@transaction.atomic
def rotate_keys(*, actor, retire_after_days=None):
    """A new key signs from now on; active keys older than ``retire_after_days`` (default
    ``LTI_KEY_RETIRE_DAYS``) leave the JWKS. Returns (the new key's kid, the retired kids).

    django-lti signs with the newest active key and publishes every active one, so a key stays
    verifiable until it is retired: rotate, then retire after the platforms' JWKS caches expire."""
    days = settings.LTI_KEY_RETIRE_DAYS if retire_after_days is None else retire_after_days
    cutoff = timezone.now() - timedelta(days=days)
    old = list(Key.objects.active().filter(datetime_created__lt=cutoff))
    new = _generate_key()
    retired = [str(key) for key in old]
    Key.objects.filter(pk__in=[key.pk for key in old]).update(is_active=False)
    changelog.record(new, "create", actor, {"retired": retired}, reason="LTI key rotation")
    log.info("LTI tool key %s made; retired %s", new, retired or "none")
    return str(new), retired


# --- platforms --------------------------------------------------------------------------


def deployment_ids_of(value):
    if not isinstance(value, list | tuple) or not value:
        raise ValidationError({"deployment_ids": ["give at least one deployment id (the LMS shows it)"]})
    ids = [str(v).strip() for v in value]
    if not all(ids) or any(len(v) > 255 for v in ids):
        raise ValidationError({"deployment_ids": ["a deployment id is 1 to 255 characters"]})
    return sorted(set(ids))


def _set_deployments(registration, ids):
    for deployment_id in ids:
        LtiDeployment.objects.update_or_create(
            registration=registration, deployment_id=deployment_id, defaults={"is_active": True}
        )
    registration.deployments.exclude(deployment_id__in=ids).update(is_active=False)


def _check(registration):
    try:
        registration.full_clean(exclude=["uuid", "public_key", "private_key"])
    except ValidationError as exc:
        if any(e.code == "unique" for errors in exc.error_dict.values() for e in errors) or "__all__" in exc.error_dict:
            raise Conflict(
                f"a platform with issuer {registration.issuer!r} and client id {registration.client_id!r} "
                "is registered already"
            ) from None
        raise


@transaction.atomic
def add_platform(*, actor, deployment_ids, **fields):
    """Register a platform (an LMS): its issuer, the client id it gave vclmgr, its key set,
    login (auth) and token URLs, and the deployment ids it launches with."""
    ids = deployment_ids_of(deployment_ids)
    unknown = set(fields) - set(PLATFORM_FIELDS)
    if unknown:
        raise ValidationError({sorted(unknown)[0]: ["not a platform field"]})
    registration = LtiRegistration(**fields)
    _check(registration)
    registration.save()
    _set_deployments(registration, ids)
    ensure_key()
    changelog.record(registration, "create", actor, {"issuer": [None, registration.issuer], "deployments": [None, ids]})
    return registration


@transaction.atomic
def update_platform(registration, *, actor, deployment_ids=None, **fields):
    """Change a platform's fields; ``deployment_ids`` (if given) become exactly its active ones."""
    before = {name: getattr(registration, name) for name in fields}
    for name, value in fields.items():
        if name not in PLATFORM_FIELDS:
            raise ValidationError({name: ["not a platform field"]})
        setattr(registration, name, value)
    _check(registration)
    registration.save()
    changes = {name: [before[name], getattr(registration, name)] for name in fields if before[name] != fields[name]}
    if deployment_ids is not None:
        ids = deployment_ids_of(deployment_ids)
        was = active_deployment_ids(registration)
        _set_deployments(registration, ids)
        if was != ids:
            changes["deployments"] = [was, ids]
    changelog.record(registration, "update", actor, changes)
    return registration


@transaction.atomic
def remove_platform(registration, *, actor):
    """Forget a platform: its launches stop. Its courses' groups and the accounts stay."""
    changelog.record(registration, "delete", actor, {"issuer": [registration.issuer, None]})
    registration.delete()


def active_deployment_ids(registration):
    return sorted(registration.deployments.filter(is_active=True).values_list("deployment_id", flat=True))


# --- login initiation and launch --------------------------------------------------------


def _refusal(exc):
    """LtiException → LaunchRefused with a reason a person can act on."""
    text = str(exc)
    known = [
        ("Missing state param", 400, "The launch has no state. Start it again from your course in the LMS."),
        (
            "State not found",
            403,
            "This browser did not start this launch (its state cookie is missing or expired). "
            "Start it again from your course in the LMS.",
        ),
        ("Invalid id_token", 400, "The launch carries no valid ID token."),
        ("Invalid JWT format", 400, "The launch's ID token cannot be read."),
        ("Missing id_token", 400, "The launch carries no ID token."),
        ('"nonce" is empty', 403, "The launch's ID token has no nonce."),
        ("Invalid Nonce", 403, "The launch's nonce is unknown or expired: start it again from the LMS."),
        ("Registration not found", 403, "The launch comes from a platform (issuer, client id) vclmgr does not know."),
        ("Client id not registered", 403, "The launch is for another client id than the one registered."),
        ("Unable to find deployment", 403, "The launch's deployment is not registered in vclmgr."),
        ("Signature has expired", 403, "The launch's ID token has expired."),
        ("Signature verification failed", 403, "The launch's signature does not match the platform's keys."),
        ("Unable to find public key", 403, "The launch is signed with a key the platform does not publish."),
        ("Error during fetch", 502, "The platform's key set could not be read; try again later."),
        ("Invalid message type", 400, "The launch's message type is missing or unknown."),
        ('"iss" is empty', 400, "The request names no issuer."),
        ("Could not find registration details", 403, "The login comes from a platform vclmgr does not know."),
    ]
    for needle, status, reason in known:
        if needle in text:
            return LaunchRefused(reason, status)
    return LaunchRefused(f"The launch was refused: {text}", 403)


def _storage():
    return DjangoCacheDataStorage()


def login_redirect(request, params):
    """The answer to the platform's third-party login initiation: a redirect to its auth URL
    with the state (also a cookie on this browser) and the nonce. No cookie check page: it is
    an inline script, which the site's Content-Security-Policy refuses."""
    target = params.get("target_link_uri")
    if not target or not params.get("iss") or not params.get("login_hint"):
        raise LaunchRefused("The login initiation lacks iss, login_hint or target_link_uri.", 400)
    # The ID token goes where target_link_uri says: only ever to our own launch URL, this site's
    # (scheme, host and port too: a path alone would let https://evil.example/lti/launch/ pass).
    ours = request.build_absolute_uri(reverse("lti:launch"))
    try:
        same = _origin_and_path(target) == _origin_and_path(ours)
    except ValueError:  # urlsplit and .port refuse a malformed URL (http://[x)
        raise LaunchRefused("The target link URI is not a valid URL.", 400) from None
    if not same:
        raise LaunchRefused(f"The target link URI must be vclmgr's launch URL ({ours}).", 400)
    login = DjangoOIDCLogin(request, ToolConfig(), launch_data_storage=_storage())
    try:
        return login.disable_check_cookies().redirect(target)
    except (LtiException, OIDCException) as exc:
        raise _refusal(exc) from None


def _origin_and_path(url):
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or {"http": 80, "https": 443}.get(scheme)
    return scheme, (parts.hostname or "").lower(), port, parts.path


def _validated(request):
    if not request.POST.get("id_token"):
        raise LaunchRefused("The launch carries no ID token.", 400)
    message = DjangoMessageLaunch(
        request, ToolConfig(), launch_data_storage=_storage(), requests_session=TimeoutSession()
    )
    try:
        message.validate()
    except LtiException as exc:
        raise _refusal(exc) from None
    except jwt.PyJWTError as exc:  # PyJWT's errors outside the signature check (a bad header)
        raise LaunchRefused(f"The launch's ID token was refused: {exc}", 400) from None
    return message


#: How long PyLTI1p3 keeps a nonce it gave (``SessionService._launch_data_lifetime``, counted
#: from the login initiation, and not dropped when used): while the nonce is in the cache the
#: same token passes its check, so a token stays spent that long from its use, whatever its exp.
NONCE_LIFETIME = 86400


def _spend(body):
    """An ID token is used once: its (issuer, nonce) is marked spent — a row of ``SpentToken``,
    whose unique digest makes the mark atomic between web processes (a file-based cache's
    ``add`` is a check then a write: two processes could both win) — for longer than its nonce
    lives. Returns the row, deleted again by a launch that wrote nothing (a request run again
    after a lost database session must not find its own token spent). Expired marks are pruned
    here, one statement."""
    now = timezone.now()
    digest = hashlib.sha256(f"{body['iss']}\n{body['nonce']}".encode()).hexdigest()
    SpentToken.objects.filter(expires__lt=now).delete()
    try:
        with transaction.atomic():
            return SpentToken.objects.create(digest=digest, expires=now + timedelta(seconds=NONCE_LIFETIME + 300))
    except IntegrityError:
        raise LaunchRefused("This launch was used already (its ID token was posted before).", 403) from None


def launch(request):
    """Validate the launch POSTed to ``request``; returns (user, course group) — see the module
    docstring — or raises ``LaunchRefused`` with nothing written."""
    message = _validated(request)
    body = message.get_launch_data()
    if not message.is_resource_launch():
        raise LaunchRefused("vclmgr takes resource link launches only (no deep linking).", 400)
    context = body.get(CONTEXT) or {}
    if not context.get("id"):
        raise LaunchRefused("The launch names no course (context claim): launch vclmgr from a course.", 400)
    if not str(body.get("sub") or ""):
        raise LaunchRefused("The launch names no user (anonymous launches are not taken).", 400)
    if body.get("exp") is None:  # PyJWT checks exp only when it is there: a token must expire
        raise LaunchRefused("The launch's ID token has no expiry (exp).", 400)
    spent = _spend(body)
    lti_launch = LtiLaunch(message)
    registration = message.get_tool_conf().registration
    try:
        user, course = _admit(registration, body, context, lti_launch)
    except Exception:
        spent.delete()
        raise
    log.info("LTI launch from %s: %s in %s (%s)", registration.issuer, user, course.group.name, course.context_id)
    return user, course.group


def _admit(registration, body, context, lti_launch, attempts=2):
    """The account and course of a launch, made on the first. Two first launches of one course
    (or one person) at the same moment both find nothing and both create: the loser's unique
    constraint fails, and its second attempt finds what the winner made."""
    for attempt in range(attempts):
        try:
            with transaction.atomic():
                sync_data_from_launch(lti_launch)
                _launch_role_is_current(registration, body, context)
                user = _account(registration, body)
                course = _course(registration, context, (body.get(NRPS) or {}).get("context_memberships_url", ""))
                actor = changelog.Actor(name=f"LTI {registration.name}")
                _enrol(user, course.group, body.get(ROLES) or [], actor=actor)
                LtiUser.objects.filter(registration=registration, sub=str(body["sub"])).update(auth_user=user)
            return user, course
        except IntegrityError:
            if attempt == attempts - 1:
                raise
            log.info("LTI launch from %s met a concurrent first launch; reading what it made", registration.issuer)


def _launch_role_is_current(registration, body, context):
    # django-lti sets a membership's is_instructor on an Instructor launch and never clears it:
    # one the LMS demoted would go on teaching the course here (lti.teaching reads it).
    LtiMembership.objects.filter(
        user__registration=registration,
        user__sub=str(body["sub"]),
        context__deployment__registration=registration,
        context__id_on_platform=str(context["id"]),
    ).update(is_instructor=is_instructor(body.get(ROLES) or []))


def is_instructor(roles):
    return ContextRole.INSTRUCTOR in {normalize_role(str(role)) for role in roles}


def _enrol(user, group, roles, *, actor):
    user.groups.add(group)
    if is_instructor(roles):
        access.grant_role(user, "instructor", actor=actor)


# --- accounts ---------------------------------------------------------------------------


@dataclass
class Person:
    """Who a launch or a roster entry says someone is."""

    sub: str
    email: str = ""
    given_name: str = ""
    family_name: str = ""
    username: str = ""

    @classmethod
    def of(cls, claims, sub_key="sub"):
        ext = claims.get(EXT) or {}
        return cls(
            sub=str(claims[sub_key]),
            email=str(claims.get("email") or ""),
            given_name=str(claims.get("given_name") or ""),
            family_name=str(claims.get("family_name") or ""),
            username=str(ext.get("user_username") or ""),
        )


def _account(registration, claims):
    return account_for(registration, Person.of(claims))


def account_for(registration, person):
    """The account of ``person`` as the registration's issuer says (found, linked or made);
    ``LaunchRefused`` if it is disabled or an administrator's."""
    user = _found_or_made(registration, person)
    _check_may_launch(user)
    bind_identity(user, "lti", registration.issuer, person.sub)
    return user


def _found_or_made(registration, person):
    bound = LtiUser.objects.filter(registration=registration, sub=person.sub, auth_user__isnull=False).first()
    user = bound.auth_user if bound else None
    if user is None:
        identity = SignOnIdentity.objects.filter(issuer=registration.issuer, subject=person.sub).first()
        user = identity.user if identity else None
    return user or _linked_or_made(registration, person)


def _linked_or_made(registration, person):
    """The account of a subject neither an earlier launch nor a sign-on identity knows."""
    users = get_user_model().objects
    user = _by_email(registration, person)
    if user is None:
        user = users.model(username=_free_username(_wanted_username(person)))
        user.set_unusable_password()
        user.email, user.first_name, user.last_name = person.email, person.given_name[:150], person.family_name[:150]
        user.save()
        changelog.record(user, "create", changelog.Actor(name=f"LTI {registration.name}"), reason="LTI launch")
        log.info("LTI %s: new account %s for subject %s", registration.issuer, user.username, person.sub)
    return user


def _check_may_launch(user):
    if not user.is_active:
        raise LaunchRefused("Your vclmgr account is disabled: ask the lab's administrators.", 403)
    if user.is_staff or user.is_superuser:
        # An earlier launch or a sign-on identity may be bound to an account later made staff:
        # an LMS's word never signs in an administrator.
        raise LaunchRefused(
            "This is an administrator's vclmgr account: administrators sign in with their own sign-in "
            "method, not from an LMS.",
            403,
        )


def _by_email(registration, person):
    """The one account of ``person``'s e-mail, if it is safe to take on the LMS's word.

    An LMS's e-mail is whatever its user typed, rarely verified: so never an account that holds
    a role or is an administrator's (the e-mail would be a key to the role), never one with a
    password (its owner signs in with it, and may not be this person), and never one another
    sign-on method or another subject vouched for (that account is someone's elsewhere)."""
    if not (settings.LTI_LINK_BY_EMAIL and person.email):
        return None
    found = list(get_user_model().objects.filter(email__iexact=person.email)[:2])
    if len(found) != 1:
        return None
    user = found[0]
    if user.is_staff or user.is_superuser or access.roles(user):
        log.warning("LTI %s: %s is the e-mail of an account with a role, not linked", registration.issuer, person.email)
        return None
    if user.has_usable_password():
        log.info("LTI %s: %s is a password account's e-mail, not linked", registration.issuer, person.email)
        return None
    others = SignOnIdentity.objects.filter(user=user).exclude(issuer=registration.issuer, subject=person.sub)
    if others.exists():
        return None
    log.info("LTI %s: subject %s linked to %s by e-mail", registration.issuer, person.sub, user.username)
    return user


def _wanted_username(person):
    name = person.username or person.email or f"lti-{person.sub}"
    return "".join(ch for ch in name if ch.isalnum() or ch in "@.+-_")[:150] or "lti-user"


def _free_username(wanted):
    users, name, n = get_user_model().objects, wanted, 1
    while users.filter(username__iexact=name).exists():
        n += 1
        name = f"{wanted[: 150 - len(str(n)) - 1]}-{n}"
    return name


# --- courses ----------------------------------------------------------------------------


def _free_group_name(title):
    wanted = (title.strip() or "LMS course")[:140]
    name, n = wanted, 1
    while Group.objects.filter(name__iexact=name).exists():
        n += 1
        name = f"{wanted} ({n})"
    return name


def _course(registration, context, memberships_url):
    title = str(context.get("title") or context.get("label") or context["id"])
    course = (
        LtiCourse.objects.select_for_update()
        .select_related("group")
        .filter(registration=registration, context_id=str(context["id"]))
        .first()
    )
    if course is None:
        group = Group.objects.create(name=_free_group_name(title))
        course = LtiCourse.objects.create(
            registration=registration, context_id=str(context["id"]), title=title, group=group
        )
        changelog.record(group, "create", changelog.Actor(name=f"LTI {registration.name}"), reason="LTI course")
    updates = {"title": title}
    if memberships_url:
        updates["memberships_url"] = memberships_url
    LtiCourse.objects.filter(pk=course.pk).update(**updates)
    course.title = title
    course.memberships_url = memberships_url or course.memberships_url
    return course


# --- roster -----------------------------------------------------------------------------


def course_of(group):
    return LtiCourse.objects.select_related("registration", "group").filter(group=group).first()


def fetch_roster(course):
    """The context's members as the platform's NRPS lists them (each call with a timeout)."""
    if not course.memberships_url:
        raise Conflict("the LMS offered no roster service (NRPS) for this course")
    connector = ServiceConnector(pylti_registration(course.registration), requests_session=TimeoutSession())
    service = NamesRolesProvisioningService(connector, {"context_memberships_url": course.memberships_url})
    try:
        return service.get_members()
    except LtiServiceException as exc:
        raise Conflict(f"the LMS refused the roster request: {exc}") from None
    except (requests.RequestException, LtiException, ValueError, KeyError) as exc:
        raise Conflict(f"the LMS's roster could not be read: {exc}") from None


def _chunks(items, size=500):
    items = list(items)
    return [items[i : i + size] for i in range(0, len(items), size)]


def _known_accounts(registration, subs):
    """{sub: account} of the subjects an earlier launch (LtiUser) or a sign-on identity of the
    issuer knows — ``_found_or_made``'s first two look-ups for a whole roster, a few statements —
    and {sub: LtiUser} of those with an LtiUser."""
    lti_users, identities = {}, {}
    for chunk in _chunks(subs):
        found = LtiUser.objects.filter(registration=registration, sub__in=chunk).select_related("auth_user")
        lti_users.update({lti_user.sub: lti_user for lti_user in found})
        bound = SignOnIdentity.objects.filter(issuer=registration.issuer, subject__in=chunk).select_related("user")
        identities.update({identity.subject: identity.user for identity in bound})
    known = {**identities, **{sub: u.auth_user for sub, u in lti_users.items() if u.auth_user is not None}}
    return known, lti_users, set(identities)


def _record_memberships(registration, context, accounts, lti_users):
    """What launches would have recorded (django-lti's LtiUser and LtiMembership) for
    ``accounts`` ({sub: user}): the course's roster vouched for them. A few statements."""
    stale = [u for sub, u in lti_users.items() if sub in accounts and u.auth_user_id != accounts[sub].pk]
    for lti_user in stale:
        lti_user.auth_user = accounts[lti_user.sub]
    LtiUser.objects.bulk_update(stale, ["auth_user"], batch_size=500)
    new = [
        LtiUser(registration=registration, sub=sub, auth_user=user)
        for sub, user in accounts.items()
        if sub not in lti_users
    ]
    LtiUser.objects.bulk_create(new, ignore_conflicts=True, batch_size=500)
    ids = []
    for chunk in _chunks(accounts):
        ids += LtiUser.objects.filter(registration=registration, sub__in=chunk).values_list("pk", flat=True)
    memberships = [LtiMembership(user_id=pk, context=context) for pk in ids]
    LtiMembership.objects.bulk_create(memberships, ignore_conflicts=True, batch_size=500)


def sync_roster(course, *, actor):
    """Make the course group's members follow the LMS roster; returns {"added": [...],
    "removed": [...], "skipped": [...]} (usernames). The platform is asked before any write.

    A member whose account is disabled or an administrator's is skipped (neither added nor
    removed), as a launch of theirs would be refused. The accounts the roster's subjects already
    have are read at once, and the members added, identities bound, instructors made and
    memberships recorded in bulk: a few statements for a roster of any size, plus a few for each
    account made."""
    members = [m for m in fetch_roster(course) if m.get("status", "Active") == "Active" and m.get("user_id")]
    people = {}
    for member in members:  # one entry per subject (the first)
        people.setdefault(str(member["user_id"]), (Person.of(member, sub_key="user_id"), member.get("roles") or []))
    registration, group = course.registration, course.group
    contexts = LtiContext.objects.filter(deployment__registration=registration, id_on_platform=course.context_id)
    with transaction.atomic():
        context = contexts.order_by("-datetime_modified", "-pk").first()
        present = set(group.user_set.values_list("pk", flat=True))
        known, lti_users, bound = _known_accounts(registration, people)
        wanted, added, skipped, accounts, instructors = set(), [], [], {}, {}
        for sub, (person, roles) in people.items():
            user = known.get(sub) or _linked_or_made(registration, person)
            wanted.add(user.pk)
            try:
                _check_may_launch(user)
            except LaunchRefused:
                skipped.append(user.username)
                continue
            accounts[sub] = user
            if user.pk not in present and user.username not in added:
                added.append(user.username)
            if is_instructor(roles):
                instructors[user.pk] = user
        SignOnIdentity.objects.bulk_create(
            [
                SignOnIdentity(user=user, method="lti", issuer=registration.issuer, subject=sub)
                for sub, user in accounts.items()
                if sub not in bound
            ],
            ignore_conflicts=True,
            batch_size=500,
        )
        group.user_set.add(*{user.pk: user for user in accounts.values() if user.pk not in present}.values())
        if instructors:
            access.grant_role(instructors.values(), "instructor", actor=actor)
        if context is not None:
            _record_memberships(registration, context, accounts, lti_users)
        # Only the members this course vouched for (a launch in it, or an earlier sync of its
        # roster: an LtiMembership in its context) leave with the roster; members added by hand
        # stay, even those an LMS signed in for another course.
        memberships = LtiMembership.objects.filter(context__in=contexts)
        vouched = set(memberships.filter(user__auth_user__in=present).values_list("user__auth_user", flat=True))
        gone = list(get_user_model().objects.filter(pk__in=vouched - wanted).order_by("username"))
        removed = [user.username for user in gone]
        group.user_set.remove(*gone)
        # Forgotten, so one added back by hand later is a hand-added member (a launch records anew).
        memberships.filter(user__auth_user__in=gone).delete()
        LtiCourse.objects.filter(pk=course.pk).update(roster_synced=timezone.now())
        if added or removed:
            changelog.record(group, "update", actor, {"added": added, "removed": removed}, reason="LMS roster")
    if skipped:
        log.info("LTI roster of %s: skipped disabled or administrators' accounts %s", group.name, skipped)
    log.info("LTI roster of %s: +%s -%s", group.name, added, removed)
    return {"added": sorted(added), "removed": removed, "skipped": sorted(skipped)}
