"""vclmgr settings, read from the environment (see docs/admin/install.md, "Configuration").

Two shapes share this file: the embedded default (SQLite, django-q2's ORM broker, the
in-memory channel layer, a file cache; nothing to install) and the scaled-out one
(``DATABASE_URL`` to PostgreSQL, ``REDIS_URL`` for broker, channel layer and cache).
"""

import ipaddress
import os
import re
import secrets
import sys
from datetime import timedelta
from pathlib import Path

import csp.constants as _csp
import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from accounts.ldap_config import ldap_settings
from accounts.saml_config import saml_settings
from core.env import Env, driver_options_errors, price_map_errors
from core.private_files import private_dir, write_private

env = Env()

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env.str("VCLMGR_VAR_DIR", str(BASE_DIR / "var")))
private_dir(VAR_DIR)

DEBUG = env.bool("DEBUG", False)


def _secret_key():
    key = env.str("SECRET_KEY", None)
    if key:
        return key
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY is required when DEBUG is off (or set SECRET_KEY_FILE); "
            "for development set DEBUG=1 and one is generated into var/"
        )
    path = VAR_DIR / "secret_key"
    if not path.exists():
        write_private(path, secrets.token_urlsafe(50))
    return path.read_text().strip()


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", [])
for _origin in CSRF_TRUSTED_ORIGINS:
    if "://" not in _origin:
        raise ImproperlyConfigured(f"CSRF_TRUSTED_ORIGINS: {_origin!r} needs a scheme (https://…)")

INSTALLED_APPS = [
    # The admin's modules are read by vclmgr/urls.py (admin.autodiscover()), not at every start:
    # a worker or a command never serves the admin, and import-export's formats cost most of a second.
    "django.contrib.admin.apps.SimpleAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_q",
    "channels",
    "import_export",
    "django_htmx",
    "csp",
    "taggit",
    "axes",
    "core.apps.CoreConfig",
    "accounts.apps.AccountsConfig",
    "inventory.apps.InventoryConfig",
    "jobs.apps.JobsConfig",
    "drivers.sim.apps.SimConfig",
    "capacity.apps.CapacityConfig",
    "provisioning.apps.VmsConfig",
    "environments.apps.EnvironmentsConfig",
    "reservations.apps.ReservationsConfig",
    "classes.apps.ClassesConfig",
    "lti_tool",  # django-lti: LTI 1.3 registrations, deployments, the tool's keys (lti/)
    "lti.apps.LtiConfig",
    "runs.apps.RunsConfig",
    "rapi.apps.RapiConfig",
    "notifications.apps.NotificationsConfig",
    "monitoring.apps.MonitoringConfig",
    "console.apps.ConsoleConfig",
    "vclmgr.apps.SiteConfig",  # the site's commands (serve, demo, kvm_demo); no models
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "accounts.middleware.TimeZoneMiddleware",  # after authentication: the user's zone
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "core.api.errors.ApiJsonErrorsMiddleware",
    "core.no_store.NoStoreMiddleware",
    "axes.middleware.AxesMiddleware",
    "core.reconnect.RetryLostSessionMiddleware",  # innermost: it runs the view again
]

ROOT_URLCONF = "vclmgr.urls"
ASGI_APPLICATION = "vclmgr.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "accounts.access.context",
            ],
        },
    },
]

# --- database -------------------------------------------------------------------------
DATABASE_URL = env.url(
    "DATABASE_URL",
    schemes={"sqlite", "postgres", "postgresql", "pgsql"},
    default=f"sqlite:///{VAR_DIR / 'vclmgr.sqlite3'}",
)
try:
    _db = dj_database_url.parse(DATABASE_URL)
except ValueError as exc:
    raise ImproperlyConfigured(f"DATABASE_URL: {exc}") from exc

if _db["ENGINE"] == "django.db.backends.sqlite3":
    # Web and worker processes write at once: WAL + a busy timeout + IMMEDIATE
    # transactions are what keep SQLite from answering "database is locked".
    _db["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;",
    }
else:
    _db["CONN_HEALTH_CHECKS"] = True
if sys.argv[1:2] == ["qcluster"]:
    # Worker processes are long-lived and sync; django-q2 closes "old" connections around
    # every task, which with the default CONN_MAX_AGE=0 means a reconnect per task.
    _db["CONN_MAX_AGE"] = env.int("VCLMGR_WORKER_CONN_MAX_AGE", 300, minimum=0)
elif _db["ENGINE"] != "django.db.backends.sqlite3":
    # Web processes share a bounded psycopg pool: a burst waits for a connection (up to the
    # timeout, then 503 + Retry-After) instead of opening one per request until PostgreSQL's
    # max_connections refuses the rest. Size it so that processes × size < max_connections.
    _pool_size = env.int("DATABASE_POOL_SIZE", 10, minimum=0)
    if _pool_size:
        _db.setdefault("OPTIONS", {})["pool"] = {
            "min_size": 1,
            "max_size": _pool_size,
            "timeout": env.float("DATABASE_POOL_TIMEOUT", 10.0, minimum=0.1),
        }
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- broker, channel layer, cache -----------------------------------------------------
REDIS_URL = env.url("REDIS_URL", schemes={"redis", "rediss", "unix"})
QUEUE_NAME = env.str("VCLMGR_QUEUE_NAME", "vclmgr")

if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": QUEUE_NAME,
        },
    }
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": f"asgi-{QUEUE_NAME}"},
        },
    }
else:
    # A file cache is shared by every process on the machine, which django-q2 needs
    # to report its workers to /healthz.
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(VAR_DIR / "cache" / (QUEUE_NAME)),
        },
    }
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
CACHES["throttle"] = (
    {**CACHES["default"], "KEY_PREFIX": f"throttle-{QUEUE_NAME}"}
    if REDIS_URL
    else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "throttle"}
)

Q_CLUSTER = {
    "name": QUEUE_NAME,
    "workers": env.int("VCLMGR_WORKERS", 2, minimum=1, maximum=64),
    # A step that outlasts `retry` would be delivered twice: keep timeout < retry.
    "timeout": env.int("VCLMGR_TASK_TIMEOUT", 300, minimum=1),
    "retry": env.int("VCLMGR_TASK_TIMEOUT", 300, minimum=1) + 60,
    "max_attempts": 3,
    "catch_up": False,
    "save_limit": 1000,
    "ack_failures": True,
    # The ORM broker's pusher looks for tasks this often when none waits (Redis is pushed):
    # a job submitted to idle workers waits up to this long. 0.1 s costs an idle cluster
    # about 5 ms of CPU a second more than 0.2 s.
    "poll": 0.1,
    "guard_cycle": 0.5,
    "cache": "default",
    "label": "Task queue",
}
if REDIS_URL:
    Q_CLUSTER["redis"] = REDIS_URL
else:
    Q_CLUSTER["orm"] = "default"

# --- auth, API ------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
AUTHENTICATION_BACKENDS = ["accounts.lockout.LockoutBackend", "accounts.signon.LocalBackend"]
# Sign-on (accounts/signon.py). LDAP / Active Directory: the AUTH_LDAP_* settings of
# django-auth-ldap, read by accounts/ldap_config.py; off without AUTH_LDAP_SERVER_URI. Local
# accounts are asked first, so the admin signs in at once while the directory is down.
globals().update(ldap_settings(env))
if globals().get("AUTH_LDAP_SERVER_URI"):
    AUTHENTICATION_BACKENDS.append("accounts.signon.DirectoryBackend")
# Local accounts only for staff (admins); everyone else through a sign-on method.
LOCAL_LOGIN_STAFF_ONLY = env.bool("LOCAL_LOGIN_STAFF_ONLY", False)
if LOCAL_LOGIN_STAFF_ONLY:
    AUTHENTICATION_BACKENDS[AUTHENTICATION_BACKENDS.index("accounts.signon.LocalBackend")] = (
        "accounts.signon.StaffOnlyModelBackend"
    )
# LTI launches' sessions (lti/backends.py: reads the session's user back, signs nobody in).
AUTHENTICATION_BACKENDS.append("lti.backends.LaunchBackend")
# Sign-in lockout (accounts/lockout.py): per username and client address.
AXES_ENABLED = env.bool("LOGIN_LOCKOUT", True)
AXES_FAILURE_LIMIT = env.int("LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env.int("LOGIN_COOLOFF_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False  # its start-up banner and per-login INFO lines would fill every command's output
# Client addresses (lockout, API throttles) come from X-Forwarded-For only behind this many
# trusted reverse proxies; otherwise a client could pick its own address per request. Behind
# a TLS-terminating proxy (TRUST_X_FORWARDED_PROTO) the default is that one proxy.
TRUSTED_PROXIES = env.int("TRUSTED_PROXIES", 1 if env.bool("TRUST_X_FORWARDED_PROTO", False) else 0, minimum=0)
AXES_CLIENT_IP_CALLABLE = "accounts.lockout.client_address"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

# Sign-on methods the login page offers besides its form (label, URL name), each appended below.
SIGN_ON_METHODS = []

# --- single sign-on: OpenID Connect (accounts/oidc.py), on when OIDC_RP_CLIENT_ID is set --------
# Variable names are mozilla-django-oidc's own, so its documentation applies.
OIDC_RP_CLIENT_ID = env.str("OIDC_RP_CLIENT_ID", "")
OIDC_ENABLED = bool(OIDC_RP_CLIENT_ID)
if OIDC_ENABLED:
    OIDC_RP_CLIENT_SECRET = env.str("OIDC_RP_CLIENT_SECRET")
    OIDC_OP_DISCOVERY_URL = env.url("OIDC_OP_DISCOVERY_URL", {"https", "http"})
    # Unset endpoints are read from the discovery document on first use (accounts/oidc.py).
    OIDC_OP_AUTHORIZATION_ENDPOINT = env.url("OIDC_OP_AUTHORIZATION_ENDPOINT", {"https", "http"})
    OIDC_OP_TOKEN_ENDPOINT = env.url("OIDC_OP_TOKEN_ENDPOINT", {"https", "http"})
    OIDC_OP_USER_ENDPOINT = env.url("OIDC_OP_USER_ENDPOINT", {"https", "http"})
    OIDC_OP_JWKS_ENDPOINT = env.url("OIDC_OP_JWKS_ENDPOINT", {"https", "http"})
    # The ID token's iss must be this (else the discovery document's issuer): without it a token
    # the provider's keys signed for another of its realms or tenants would pass.
    OIDC_OP_ISSUER = env.str("OIDC_OP_ISSUER", "")
    OIDC_RP_SIGN_ALGO = env.choice("OIDC_RP_SIGN_ALGO", ["rs256", "es256", "hs256"], "rs256").upper()
    if not OIDC_OP_DISCOVERY_URL:
        _missing = [
            name
            for name in (
                "OIDC_OP_ISSUER",
                "OIDC_OP_AUTHORIZATION_ENDPOINT",
                "OIDC_OP_TOKEN_ENDPOINT",
                "OIDC_OP_USER_ENDPOINT",
            )
            + (("OIDC_OP_JWKS_ENDPOINT",) if OIDC_RP_SIGN_ALGO != "HS256" else ())
            if not globals()[name]
        ]
        if _missing:
            raise ImproperlyConfigured(f"OIDC_RP_CLIENT_ID is set: set OIDC_OP_DISCOVERY_URL or {', '.join(_missing)}")
    OIDC_RP_SCOPES = env.str("OIDC_RP_SCOPES", "openid email profile")
    OIDC_USE_PKCE = env.bool("OIDC_USE_PKCE", True)
    OIDC_LINK_VERIFIED_EMAIL = env.bool("OIDC_LINK_VERIFIED_EMAIL", False)  # accounts/oidc.py: off, never by name
    OIDC_VERIFY_SSL = env.bool("OIDC_VERIFY_SSL", True)
    OIDC_TIMEOUT = env.float("OIDC_TIMEOUT", 10.0, minimum=0.1)
    OIDC_GROUPS_CLAIM = env.str("OIDC_GROUPS_CLAIM", "groups")
    OIDC_GROUP_MAP = env.json(
        "OIDC_GROUP_MAP",
        {},
        check=lambda v: (
            None
            if isinstance(v, dict) and all(isinstance(k, str) and isinstance(g, str) and g for k, g in v.items())
            else 'expected an object of claim value → group name, e.g. {"cs101-students": "cs101"}'
        ),
    )
    OIDC_PROVIDER_NAME = env.str("OIDC_PROVIDER_NAME", "OpenID Connect")
    OIDC_AUTHENTICATE_CLASS = "accounts.oidc.RequestView"
    OIDC_CALLBACK_CLASS = "accounts.oidc.CallbackView"
    AUTHENTICATION_BACKENDS.append("accounts.oidc.Backend")
    SIGN_ON_METHODS.append({"label": f"Sign in with {OIDC_PROVIDER_NAME}", "url_name": "oidc_authentication_init"})

# --- single sign-on: SAML 2.0 / Shibboleth (accounts/saml.py), on when the IdP's metadata is set --
# djangosaml2's and pysaml2's names (SAML_*), read and checked by accounts/saml_config.py.
globals().update(saml_settings(env, debug=DEBUG))
SAML_ENABLED = "SAML_CONFIG" in globals()
if SAML_ENABLED:
    INSTALLED_APPS.append("djangosaml2")
    # Its own session (cookie saml_session) keeps the outstanding requests and the subject
    # for single logout across the IdP round trip.
    MIDDLEWARE.insert(
        MIDDLEWARE.index("django.contrib.sessions.middleware.SessionMiddleware") + 1,
        "djangosaml2.middleware.SamlSessionMiddleware",
    )
    AUTHENTICATION_BACKENDS.append("accounts.saml.Backend")
    SIGN_ON_METHODS.append({"label": f"Sign in with {globals()['SAML_PROVIDER_NAME']}", "url_name": "saml2_login"})

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.api.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
        # Last: counts every request the others did not authenticate against the anon rate.
        "core.api.throttling.UnauthenticatedThrottle",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["accounts.api.permissions.IsAuthenticatedWithTokenScope"],
    "DEFAULT_PAGINATION_CLASS": "core.api.pagination.Pagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": [
        "core.api.filtering.FilterBackend",
        "rest_framework.filters.SearchFilter",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "core.api.errors.exception_handler",
    "DEFAULT_THROTTLE_CLASSES": ["core.api.throttling.UserThrottle"],
    "DEFAULT_THROTTLE_RATES": {
        "anon": env.str("API_THROTTLE_ANON", "120/min"),
        "user": env.str("API_THROTTLE_USER", "6000/min"),
    },
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
    "NUM_PROXIES": TRUSTED_PROXIES,
    "DEFAULT_PARSER_CLASSES": [
        "core.api.parsers.JSONParser",
        "core.api.parsers.FormParser",
        "core.api.parsers.MultiPartParser",
    ],
}
# A JSON or form body over this size is refused with 413 before it is parsed (bulk imports take
# INVENTORY_IMPORT_MAX_BYTES instead); JSON nested deeper than this is refused with 400.
API_MAX_BODY_BYTES = env.int("API_MAX_BODY_BYTES", 2_621_440, minimum=1024)
API_MAX_JSON_DEPTH = env.int("API_MAX_JSON_DEPTH", 32, minimum=2, maximum=500)
SPECTACULAR_SETTINGS = {
    "TITLE": "vclmgr API",
    "DESCRIPTION": "Self-service virtual computing lab and cluster virtualization manager.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["accounts.api.permissions.SchemaAccess"],
    # The ways to sign in (the throttle at the end of the authentication classes is none).
    "AUTHENTICATION_WHITELIST": [
        "accounts.api.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "DeliveryStateEnum": "notifications.models.Delivery.State",
        "StateEnum": "inventory.models.Hypervisor.State",  # its name before deliveries had states too
        "ImageVariantFormatEnum": "drivers.base.FORMATS",  # its name before revisions' variants had formats too
    },
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "APPEND_COMPONENTS": {
        "securitySchemes": {"tokenAuth": {"type": "http", "scheme": "bearer", "description": "An API token (vcl_…)"}}
    },
    "SECURITY": [{"tokenAuth": []}, {"cookieAuth": []}],
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "core.api.schema.add_error_responses",
    ],
}

# Key for encrypting hypervisor credentials at rest (Fernet, urlsafe base64 of 32 bytes).
CREDENTIAL_KEY = env.str("CREDENTIAL_KEY", None)

# --- inventory ------------------------------------------------------------------------
INVENTORY_IMPORT_MAX_BYTES = env.int("INVENTORY_IMPORT_MAX_BYTES", 20 * 1024 * 1024, minimum=1024)
INVENTORY_IMPORT_MAX_ROWS = env.int("INVENTORY_IMPORT_MAX_ROWS", 20_000, minimum=1)
# How often every online or drained host's facts are re-read from its driver (0: never).
FACTS_REFRESH_MINUTES = env.int("FACTS_REFRESH_MINUTES", 10, minimum=0)
# How often cluster.verify compares the database with every hypervisor (0: never on its own).
VERIFY_MINUTES = env.int("VERIFY_MINUTES", 60, minimum=0)
# After this many failed facts refreshes in a row an unreachable host is marked offline and the
# reservations whose VMs ran on it are rebuilt elsewhere (the first failure drains it; 0: never).
HOST_OFFLINE_AFTER_CHECKS = env.int("HOST_OFFLINE_AFTER_CHECKS", 3, minimum=0)

# --- hypervisor drivers and VMs ------------------------------------------------------
# Options for every host of a driver kind, as JSON: {"vmware": {"insecure": true}, "libvirt": {...}}.
# Sockets of local libvirt daemons a libvirt URI may name with ?socket= (comma-separated paths).
VCLMGR_LIBVIRT_SOCKETS = env.list("VCLMGR_LIBVIRT_SOCKETS", [])
# The driver kinds of drivers/registry.py's table, named here so that settings need
# not import the app (tests/vclmgr/test_settings.py keeps the two lists equal).
DRIVER_KINDS = ("sim", "libvirt", "vmware")

VCLMGR_DRIVER_OPTIONS = env.json(
    "VCLMGR_DRIVER_OPTIONS", {}, check=lambda value: driver_options_errors(value, DRIVER_KINDS)
)
# Options for every simulated host that win over its own capacity fields, e.g. {"delay": 0.5}.
VCLMGR_SIM_OPTIONS = env.json(
    "VCLMGR_SIM_OPTIONS", {}, check=lambda v: None if isinstance(v, dict) else f"expected a JSON object, got {v!r}"
)
# Timeouts of the hypervisors' APIs, in seconds (docs/security.md lists every outside call's).
# libvirt: an open that has not answered within VCLMGR_LIBVIRT_OPEN_TIMEOUT fails (retryable), and
# an open connection whose peer stays silent for VCLMGR_LIBVIRT_CALL_TIMEOUT (keepalive) is
# dropped, failing the call that waits on it. vSphere: each connect and each read of its API and
# of a file transfer.
VCLMGR_LIBVIRT_OPEN_TIMEOUT = env.float("VCLMGR_LIBVIRT_OPEN_TIMEOUT", 10.0, minimum=0.1, maximum=600)
VCLMGR_LIBVIRT_CALL_TIMEOUT = env.int("VCLMGR_LIBVIRT_CALL_TIMEOUT", 60, minimum=2, maximum=3600)
VCLMGR_VSPHERE_TIMEOUT = env.float("VCLMGR_VSPHERE_TIMEOUT", 30.0, minimum=0.1, maximum=600)
# Concurrent image transfers onto one host, into one blade center, and in all.
VCLMGR_STAGE_PER_HOST = env.int("VCLMGR_STAGE_PER_HOST", 2, minimum=1)
VCLMGR_STAGE_PER_CHASSIS = env.int("VCLMGR_STAGE_PER_CHASSIS", 4, minimum=1)
VCLMGR_STAGE_GLOBAL = env.int("VCLMGR_STAGE_GLOBAL", 16, minimum=1)
# A new production revision is copied ahead onto the hosts of the class sessions (block seats)
# starting within this many hours (reservations/prestage.py; 0: never ahead).
VCLMGR_PRESTAGE_LOOKAHEAD_HOURS = env.int("VCLMGR_PRESTAGE_LOOKAHEAD_HOURS", 24, minimum=0, maximum=24 * 14)
# An image variant's http(s):// location is downloaded under the outbound policy (below): the
# whole download within VCLMGR_IMAGE_FETCH_TIMEOUT seconds, at most VCLMGR_IMAGE_FETCH_MAX_GIB.
VCLMGR_IMAGE_FETCH_TIMEOUT = env.int("VCLMGR_IMAGE_FETCH_TIMEOUT", 3600, minimum=1)
VCLMGR_IMAGE_FETCH_MAX_GIB = env.int("VCLMGR_IMAGE_FETCH_MAX_GIB", 100, minimum=1)
# A disk image a user uploads (qcow2, raw, an OVA): at most this large as a file, and at most
# this large as the disk its VMs see (provisioning/disks.py refuses the rest).
IMAGE_UPLOAD_MAX_FILE_GIB = env.int("IMAGE_UPLOAD_MAX_FILE_GIB", 50, minimum=1)
IMAGE_UPLOAD_MAX_VIRTUAL_GIB = env.int("IMAGE_UPLOAD_MAX_VIRTUAL_GIB", 200, minimum=1)
# Uploads arrive in IMAGE_UPLOAD_DIR (private, a resumable upload's bytes so far); one left
# untouched for IMAGE_UPLOAD_EXPIRE_HOURS is removed. Accepted disks are kept in IMAGE_STORE_DIR
# (the variant's location: hosts are sent the file from there). A user's uploaded images take at
# most IMAGE_STORAGE_QUOTA_GIB there, uploads in progress counted at their announced length.
IMAGE_UPLOAD_DIR = Path(env.str("IMAGE_UPLOAD_DIR", str(VAR_DIR / "uploads")))
IMAGE_STORE_DIR = Path(env.str("IMAGE_STORE_DIR", str(VAR_DIR / "images")))
IMAGE_UPLOAD_EXPIRE_HOURS = env.int("IMAGE_UPLOAD_EXPIRE_HOURS", 24, minimum=1)
IMAGE_STORAGE_QUOTA_GIB = env.int("IMAGE_STORAGE_QUOTA_GIB", 100, minimum=0)
# How long vm.create waits for a booted VM to report its address, in seconds.
VCLMGR_ADDRESS_TIMEOUT = env.int("VCLMGR_ADDRESS_TIMEOUT", 120, minimum=1)

# Host power through Redfish: seconds per BMC request, the wait for a graceful shutdown
# before it is forced, the wait for the BMC to report On/Off after a reset, and the wait
# for a powered-on host's hypervisor to answer before it goes back online.
VCLMGR_BMC_TIMEOUT = env.int("VCLMGR_BMC_TIMEOUT", 10, minimum=1)
VCLMGR_BMC_GRACEFUL_SECONDS = env.int("VCLMGR_BMC_GRACEFUL_SECONDS", 60, minimum=0)
VCLMGR_BMC_POWER_SECONDS = env.int("VCLMGR_BMC_POWER_SECONDS", 120, minimum=1)
VCLMGR_POWER_ON_BOOT_SECONDS = env.int("VCLMGR_POWER_ON_BOOT_SECONDS", 600, minimum=1)

# What vclmgr connects to on a user's or operator's say-so (webhooks, BMCs, discovery URIs, images)
# must be a public address; VCLMGR_OUTBOUND_ALLOW names the networks (CIDR or one address)
# and host names it may reach besides, e.g. "10.20.0.0/16, bmc.lab.example.org".
VCLMGR_OUTBOUND_ALLOW = env.list("VCLMGR_OUTBOUND_ALLOW", [])
for _entry in VCLMGR_OUTBOUND_ALLOW:
    try:
        ipaddress.ip_network(_entry, strict=False)
    except ValueError:
        if not re.fullmatch(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?\.?", _entry):
            raise ImproperlyConfigured(
                f"VCLMGR_OUTBOUND_ALLOW: {_entry!r} is neither a network (10.20.0.0/16) nor a host name"
            ) from None

# --- placement ------------------------------------------------------------------------
# IAllocator programs the "external" placement policy may run, by name:
# "name=command [options];name=command". Node groups choose one by name, so only whoever
# sets the environment decides what the workers execute.
IALLOCATORS = env.mapping("IALLOCATORS", {"hail": "/usr/lib/ganeti/3.0/usr/lib/ganeti/iallocators/hail"})
# The one used when a node group (or a request's policy override) names none; "" for none.
DEFAULT_IALLOCATOR = env.str("DEFAULT_IALLOCATOR", "hail")
if DEFAULT_IALLOCATOR and DEFAULT_IALLOCATOR not in IALLOCATORS:
    raise ImproperlyConfigured(f"DEFAULT_IALLOCATOR {DEFAULT_IALLOCATOR!r} is not one of IALLOCATORS")

# A directory where the input of every refused placement decision is saved for replay
# (as hail's --save); empty: none are saved.
VCLMGR_SAVE_REFUSED_DECISIONS = env.str("VCLMGR_SAVE_REFUSED_DECISIONS", "")

# --- environments ---------------------------------------------------------------------
# The most machines one environment template stands for (its members' counts added up).
ENVIRONMENT_MAX_MACHINES = env.int("ENVIRONMENT_MAX_MACHINES", 16, minimum=1)

# --- reservations ---------------------------------------------------------------------
# VCL's preload: a future reservation's VM is built this long before its start.
RESERVATION_LEAD_MINUTES = env.int("RESERVATION_LEAD_MINUTES", 10, minimum=0)
# The site's quota defaults (``provisioning.quotas``; rules can only tighten them): the longest
# reservation or ad-hoc VM, and how many of them one user may hold at once.
RESERVATION_MAX_MINUTES = env.int("RESERVATION_MAX_MINUTES", 8 * 60, minimum=1)
RESERVATION_MAX_PER_USER = env.int("RESERVATION_MAX_PER_USER", 3, minimum=1)
# A non-staff user's ad-hoc VM asked for without an end is destroyed after this long (at most
# the longest time the quota allows).
VM_DEFAULT_MINUTES = env.int("VM_DEFAULT_MINUTES", 2 * 60, minimum=1)
# How far ahead a reservation may start, and when the "ending soon" warning goes out.
RESERVATION_HORIZON_DAYS = env.int("RESERVATION_HORIZON_DAYS", 90, minimum=1)
RESERVATION_WARN_MINUTES = env.int("RESERVATION_WARN_MINUTES", 10, minimum=0)
# The priority class of interactive reservations, on the runs' ladder (low < batch < high): a
# reservation starting now that does not fit may suspend runs of a lower class to make room
# (high: low and batch runs; low: never).
RESERVATION_PRIORITY = env.choice("RESERVATION_PRIORITY", ("low", "batch", "high"), "high")
# The scheduler's tick (starts, ends, warnings, block seats), in seconds.
RESERVATION_TICK_SECONDS = env.int("RESERVATION_TICK_SECONDS", 30, minimum=5)
# Classes with a term (``classes``): sessions starting within CLASS_LOOKAHEAD_DAYS are claimed
# (all seats or none), later ones as they come into it; a class has at most CLASS_MAX_SEATS seats.
CLASS_LOOKAHEAD_DAYS = env.int("CLASS_LOOKAHEAD_DAYS", 14, minimum=1, maximum=90)
CLASS_MAX_SEATS = env.int("CLASS_MAX_SEATS", 200, minimum=1, maximum=1000)
CLASS_PLAN_SECONDS = env.int("CLASS_PLAN_SECONDS", 60, minimum=5)
# Warm pools (``provisioning.warm``): each worker tops the images' pools up this often, in seconds.
WARM_POOL_SECONDS = env.int("WARM_POOL_SECONDS", 30, minimum=5)
# A pooled image's wanted warm VMs for the coming hour: the WARM_HISTORY_PERCENTILE of its
# reservations starting in the same hour of each of the last WARM_HISTORY_WEEKS weeks, kept
# within its warm_min..warm_max (0 weeks: warm_min).
WARM_HISTORY_WEEKS = env.int("WARM_HISTORY_WEEKS", 4, minimum=0, maximum=52)
WARM_HISTORY_PERCENTILE = env.int("WARM_HISTORY_PERCENTILE", 75, minimum=1, maximum=100)
# A class session's seats get warm VMs this long before they are built (the class's lead_minutes
# before its start), for the build to take instead of booting (0: none).
CLASS_WARM_MINUTES = env.int("CLASS_WARM_MINUTES", 15, minimum=0, maximum=24 * 60)

# Approvals (``reservations.approvals``): a request for an image or a class that requires approval
# waits this long for an approver (no longer than until it would start), then expires.
# APPROVERS_BY_GROUP: an approver decides the requests of their own groups' members (off: anyone's).
APPROVAL_EXPIRY_HOURS = env.int("APPROVAL_EXPIRY_HOURS", 48, minimum=1, maximum=24 * 90)
APPROVERS_BY_GROUP = env.bool("APPROVERS_BY_GROUP", True)
# Idle reclamation (``reservations.idle``): the site's policy where no image or group has its
# own (0: off): end a ready reservation nobody logged in to within IDLE_NO_SHOW_MINUTES, or one
# without a login or input for IDLE_MINUTES (warned IDLE_WARN_MINUTES before). Guests are asked
# at most every IDLE_CHECK_SECONDS.
IDLE_NO_SHOW_MINUTES = env.int("IDLE_NO_SHOW_MINUTES", 0, minimum=0)
IDLE_MINUTES = env.int("IDLE_MINUTES", 0, minimum=0)
IDLE_WARN_MINUTES = env.int("IDLE_WARN_MINUTES", 10, minimum=0)
IDLE_CHECK_SECONDS = env.int("IDLE_CHECK_SECONDS", 60, minimum=1)
# Showback (``reservations.showback``): a price per unit of use gives the usage report a cost
# column, in USAGE_CURRENCY, e.g. {"vcpu_hour": 0.01, "gib_hour": 0.005, "gpu_hour": 0.5, "hour": 0}.
# Unset: no cost column.
# (The units are named here, not imported: a test keeps them equal to reservations.showback's.)
USAGE_PRICE_UNITS = ("hour", "vcpu_hour", "gib_hour", "gpu_hour")
USAGE_PRICES = env.json("USAGE_PRICES", {}, check=lambda v: price_map_errors(v, USAGE_PRICE_UNITS))
USAGE_CURRENCY = env.str("USAGE_CURRENCY", "")
IDLE_MINUTE_SECONDS = 60  # the unit of the limits above and of idle policies; a test shortens it

# --- batch runs (runs/) ----------------------------------------------------------------
# The range a run's time limit may take (seconds), and the default.
RUN_MIN_SECONDS = env.int("RUN_MIN_SECONDS", 10, minimum=1)
RUN_MAX_SECONDS = env.int("RUN_MAX_SECONDS", 6 * 3600, minimum=1)
RUN_DEFAULT_SECONDS = env.int("RUN_DEFAULT_SECONDS", 30 * 60, minimum=1)
# Output kept per run (the rest is counted, dropped, and the log says so); input files per run
# (all together); one artifact; the longest command (bytes of argv or script).
RUN_OUTPUT_MAX_BYTES = env.int("RUN_OUTPUT_MAX_BYTES", 4 << 20, minimum=1024)
RUN_INPUT_MAX_BYTES = env.int("RUN_INPUT_MAX_BYTES", 16 << 20, minimum=0)
RUN_ARTIFACT_MAX_BYTES = env.int("RUN_ARTIFACT_MAX_BYTES", 64 << 20, minimum=0)
# Artifacts kept per run: the guest lists what matches, and may list any number of names.
RUN_ARTIFACT_MAX_FILES = env.int("RUN_ARTIFACT_MAX_FILES", 100, minimum=0)
RUN_COMMAND_MAX_BYTES = env.int("RUN_COMMAND_MAX_BYTES", 64 << 10, minimum=16)
# The work directory in the guest (inputs go in, artifact patterns are relative to it).
RUN_WORKDIR = env.str("RUN_WORKDIR", "/tmp/vclmgr-run")
# How long one step of a run's job waits on the command before recording its place (seconds;
# a step must stay well inside the task timeout), and how often it asks the guest meanwhile.
RUN_STEP_SECONDS = env.float("RUN_STEP_SECONDS", 10, minimum=0)
RUN_POLL_SECONDS = env.float("RUN_POLL_SECONDS", 0.5, minimum=0)
# Time allowed to build and boot a run's VM, on top of its time limit, in its claim.
RUN_BOOT_MINUTES = env.int("RUN_BOOT_MINUTES", 15, minimum=1)
# The longest a failed run's VM may be kept stopped for inspection (minutes; 0: never kept).
RUN_KEEP_FAILED_MAX_MINUTES = env.int("RUN_KEEP_FAILED_MAX_MINUTES", 24 * 60, minimum=0)
# Days an ended run's output, input files and artifacts are kept (0: for ever); the run's row stays.
RUNS_RETENTION_DAYS = env.int("RUNS_RETENTION_DAYS", 30, minimum=0)
# Where inputs and artifacts are kept: Django's storage API (any backend; files under var/ by default).
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "runs": {
        "BACKEND": env.str("RUN_STORAGE_BACKEND", "django.core.files.storage.FileSystemStorage"),
        "OPTIONS": {"location": env.str("RUN_STORAGE_DIR", str(VAR_DIR / "runs"))},
    },
}

# --- jobs -----------------------------------------------------------------------------
# Queued + waiting jobs one user may have submitted through the web or the API at once: one
# user's backlog never buries everybody else's jobs (jobs the system submits for them and
# child jobs do not count against it).
VCLMGR_JOBS_MAX_PENDING_PER_USER = env.int("VCLMGR_JOBS_MAX_PENDING_PER_USER", 100, minimum=1)

# --- events ---------------------------------------------------------------------------
EVENTS_POLL_SECONDS = env.float("EVENTS_POLL_SECONDS", 0.2, minimum=0.01)
EVENTS_RETENTION_DAYS = env.int("EVENTS_RETENTION_DAYS", 7, minimum=1)
# How often a websocket opened with an API token checks that the token still works.
WS_TOKEN_RECHECK_SECONDS = env.float("WS_TOKEN_RECHECK_SECONDS", 30.0, minimum=0.1)
# --- web console ----------------------------------------------------------------------
# How long a one-time console ticket may wait for its websocket (the page asks for one right
# before it connects, so a few seconds suffice; a spent ticket is never valid again).
CONSOLE_TICKET_SECONDS = env.int("CONSOLE_TICKET_SECONDS", 30, minimum=1, maximum=600)
# How often an open console socket records that it is still open (idle reclamation counts an
# open console as activity; one whose beats stopped, its web process gone, ended at its last beat).
CONSOLE_HEARTBEAT_SECONDS = env.int("CONSOLE_HEARTBEAT_SECONDS", 60, minimum=1, maximum=3600)
HEALTHZ_REQUIRE_WORKERS = env.bool("HEALTHZ_REQUIRE_WORKERS", True)

# --- e-mail notifications, webhooks (notifications/) ----------------------------------
# Django's own e-mail settings. Without EMAIL_HOST mail goes to files under var/mail (nothing
# leaves the machine until SMTP is configured); EMAIL_BACKEND picks one explicitly.
EMAIL_HOST = env.str("EMAIL_HOST", "")
EMAIL_PORT = env.int("EMAIL_PORT", 25, minimum=1, maximum=65535)
EMAIL_HOST_USER = env.str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env.str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env.bool("EMAIL_USE_SSL", False)
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise ImproperlyConfigured("EMAIL_USE_TLS and EMAIL_USE_SSL: set one of them, not both")
EMAIL_TIMEOUT = env.int("EMAIL_TIMEOUT", 10, minimum=1)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", "vclmgr@localhost")
_email_backend = env.choice(
    "EMAIL_BACKEND", ("smtp", "filebased", "console", "dummy"), "smtp" if EMAIL_HOST else "filebased"
)
EMAIL_BACKEND = f"django.core.mail.backends.{_email_backend}.EmailBackend"
EMAIL_FILE_PATH = str(VAR_DIR / "mail")
# "Ending soon" mails go this many minutes before a reservation's end (0: none).
NOTIFY_ENDING_MINUTES = env.int("NOTIFY_ENDING_MINUTES", 15, minimum=0)
# Mail and webhook deliveries: tries, the first retry's delay (doubling each time), how often
# each worker looks for due ones, and a webhook request's timeout.
NOTIFY_MAX_ATTEMPTS = env.int("NOTIFY_MAX_ATTEMPTS", 5, minimum=1, maximum=50)
NOTIFY_RETRY_SECONDS = env.float("NOTIFY_RETRY_SECONDS", 30.0, minimum=0.1)
NOTIFY_POLL_SECONDS = env.float("NOTIFY_POLL_SECONDS", 5.0, minimum=0.1)
# Sending runs on the workers that run jobs: one round sends for at most this long and queues
# the rest again, so slow receivers hold a job slot no longer (kept well inside the send task's
# 60 s timeout). A webhook try has this whole time, connect to answer; it must fit in a round.
NOTIFY_SEND_BUDGET_SECONDS = env.float("NOTIFY_SEND_BUDGET_SECONDS", 15.0, minimum=0.5, maximum=30)
WEBHOOK_TIMEOUT_SECONDS = env.float("WEBHOOK_TIMEOUT_SECONDS", 3.0, minimum=0.1, maximum=10)
if WEBHOOK_TIMEOUT_SECONDS > NOTIFY_SEND_BUDGET_SECONDS:
    raise ImproperlyConfigured(
        "WEBHOOK_TIMEOUT_SECONDS: must be at most NOTIFY_SEND_BUDGET_SECONDS (a try fits a round)"
    )
# How long each process trusts its list of active webhooks before reading it again.
WEBHOOK_CACHE_SECONDS = env.float("WEBHOOK_CACHE_SECONDS", 10.0, minimum=0)

# --- metrics (monitoring/) ------------------------------------------------------------
# /metrics answers a request with "Authorization: Bearer METRICS_TOKEN" or from an address in
# METRICS_ALLOWED_NETWORKS (CIDRs); with neither set it answers nobody (403).
METRICS_TOKEN = env.str("METRICS_TOKEN", "")
METRICS_ALLOWED_NETWORKS = env.list("METRICS_ALLOWED_NETWORKS", [])
for _net in METRICS_ALLOWED_NETWORKS:
    try:
        ipaddress.ip_network(_net, strict=False)
    except ValueError:
        raise ImproperlyConfigured(f"METRICS_ALLOWED_NETWORKS: {_net!r} is not a network (e.g. 10.0.0.0/8)") from None
# Counters and histograms of every process on this machine (prometheus_client multiprocess
# mode): read before prometheus_client is first imported, so it is set here for the children too.
PROMETHEUS_MULTIPROC_DIR = env.str("PROMETHEUS_MULTIPROC_DIR", "") or str(VAR_DIR / "metrics")
os.environ["PROMETHEUS_MULTIPROC_DIR"] = PROMETHEUS_MULTIPROC_DIR
# 0700: prometheus_client creates its per-process files with the umask's bits; the folder keeps
# everyone else out of them.
private_dir(PROMETHEUS_MULTIPROC_DIR)

# --- i18n, static ---------------------------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = env.str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True
STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Where collectstatic puts the static files whitenoise serves; the container image keeps them in
# the image (deploy/Containerfile), since its var/ is a per-container tmpfs.
STATIC_ROOT = Path(env.str("STATIC_ROOT", str(VAR_DIR / "staticfiles")))
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# --- LTI 1.3 (lti/): courses launched from an LMS ----------------------------------------
# Every call to a platform (its key set, its token URL, its roster) gives up after this long.
LTI_TIMEOUT_SECONDS = env.float("LTI_TIMEOUT_SECONDS", 10.0, minimum=0.5, maximum=60)
# A tool key older than this many days leaves the JWKS at the next `manage.py lti rotate-keys`
# (the platforms cache the JWKS: the old key stays published that long after a rotation).
LTI_KEY_RETIRE_DAYS = env.int("LTI_KEY_RETIRE_DAYS", 7, minimum=0)
# A first launch whose e-mail is that of one existing account with no role, no password and no
# other sign-on identity signs in as that account; off (the default): such a launch gets a new
# account of its own. Turn it on only when the LMS's e-mails are verified.
LTI_LINK_BY_EMAIL = env.bool("LTI_LINK_BY_EMAIL", False)

# --- security -------------------------------------------------------------------------
# Who sees /healthz's per-check details (the status code is public): staff or public.
HEALTHZ_DETAILS = env.choice("HEALTHZ_DETAILS", ("staff", "public"), "staff")
# Who may read /api/v1/schema/ and /api/v1/docs/: users (signed in), staff or public.
API_SCHEMA_ACCESS = env.choice("API_SCHEMA_ACCESS", ("users", "staff", "public"), "users")
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", not DEBUG)
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", not DEBUG)
# The IdP posts its answer from another site: the SAML session cookie must travel with that
# POST (SameSite=None, which browsers accept only on a Secure cookie; Lax on plain-HTTP dev).
SAML_SESSION_COOKIE_SAMESITE = "None" if SESSION_COOKIE_SECURE else "Lax"
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", not DEBUG)
SECURE_REDIRECT_EXEMPT = [r"^healthz(/live|/ready)?$", r"^metrics$"]
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", 0 if DEBUG else 31536000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", not DEBUG)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", not DEBUG)
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
# Content-Security-Policy (django-csp): only this origin's files run, inline scripts, styles
# and handlers never do (templates use static/js/ and data attributes). 'self' also covers
# the same origin's ws:/wss: websocket (CSP level 3).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [_csp.SELF],
        "script-src": [_csp.SELF],
        "style-src": [_csp.SELF],
        "img-src": [_csp.SELF, "data:"],
        "font-src": [_csp.SELF],
        "connect-src": [_csp.SELF],
        "object-src": [_csp.NONE],
        "base-uri": [_csp.SELF],
        "form-action": [_csp.SELF],
        "frame-ancestors": [_csp.NONE],
    },
}
if env.bool("TRUST_X_FORWARDED_PROTO", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SILENCED_SYSTEM_CHECKS = env.list("SILENCED_SYSTEM_CHECKS", [])

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(processName)s %(name)s %(levelname)s %(message)s"}},
    "handlers": {"stdout": {"class": "logging.StreamHandler", "formatter": "plain", "stream": "ext://sys.stdout"}},
    "root": {"handlers": ["stdout"], "level": env.str("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
