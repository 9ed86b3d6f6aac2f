"""vclmgr settings, read from the environment (see README "Configuration").

Two shapes share this file: the embedded default (SQLite, django-q2's ORM broker, the
in-memory channel layer, a file cache; nothing to install) and the scaled-out one
(``DATABASE_URL`` to PostgreSQL, ``REDIS_URL`` for broker, channel layer and cache).
"""

import secrets
import sys
from datetime import timedelta
from pathlib import Path

import csp.constants as _csp
import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from provisioning.drivers.registry import options_errors as _driver_options_errors
from vclmgr.env import Env
from vclmgr.private_files import private_dir, write_private

env = Env()

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env.str("VCLMGR_VAR_DIR", str(BASE_DIR / "var")))
private_dir(VAR_DIR)

# Test runs in parallel (pytest-xdist) and the worker processes they start share one
# machine; this suffix keeps their queues, caches and stats apart.
_ISOLATION = env.str("PYTEST_XDIST_WORKER", "")

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
    "daphne",
    "django.contrib.admin",
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
    "vclmgr.apps.VclmgrConfig",
    "inventory.apps.InventoryConfig",
    "provisioning.jobs.apps.JobsConfig",
    "provisioning.drivers.sim.apps.SimConfig",
    "provisioning.capacity.apps.CapacityConfig",
    "provisioning.vms.apps.VmsConfig",
    "reservations.apps.ReservationsConfig",
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
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "vclmgr.api.errors.ApiJsonErrorsMiddleware",
    "vclmgr.no_store.NoStoreMiddleware",
    "axes.middleware.AxesMiddleware",
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
    # A file, not memory, so worker processes started by tests see the test database.
    _db["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}
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
            "min_size": 1, "max_size": _pool_size,
            "timeout": env.float("DATABASE_POOL_TIMEOUT", 10.0, minimum=0.1),
        }  # fmt: skip
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- broker, channel layer, cache -----------------------------------------------------
REDIS_URL = env.url("REDIS_URL", schemes={"redis", "rediss", "unix"})
QUEUE_NAME = env.str("VCLMGR_QUEUE_NAME", "vclmgr" + (f"-{_ISOLATION}" if _ISOLATION else ""))

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
    "poll": 0.2,
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
if env.bool("VCLMGR_TEST_FAST_HASHER", False):
    # Processes started by the tests must verify the cheap hashes the test process writes.
    PASSWORD_HASHERS = [
        "django.contrib.auth.hashers.PBKDF2PasswordHasher",
        "django.contrib.auth.hashers.MD5PasswordHasher",
    ]
AUTHENTICATION_BACKENDS = ["vclmgr.lockout.LockoutBackend", "django.contrib.auth.backends.ModelBackend"]
# Sign-in lockout (vclmgr/lockout.py): per username and client address.
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
AXES_CLIENT_IP_CALLABLE = "vclmgr.lockout.client_address"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "vclmgr.api.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
        # Last: counts every request the others did not authenticate against the anon rate.
        "vclmgr.api.throttling.UnauthenticatedThrottle",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["vclmgr.api.permissions.IsAuthenticatedWithTokenScope"],
    "DEFAULT_PAGINATION_CLASS": "vclmgr.api.pagination.Pagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": [
        "vclmgr.api.filtering.FilterBackend",
        "rest_framework.filters.SearchFilter",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "vclmgr.api.errors.exception_handler",
    "DEFAULT_THROTTLE_CLASSES": ["vclmgr.api.throttling.UserThrottle"],
    "DEFAULT_THROTTLE_RATES": {
        "anon": env.str("API_THROTTLE_ANON", "120/min"),
        "user": env.str("API_THROTTLE_USER", "6000/min"),
    },
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
    "NUM_PROXIES": TRUSTED_PROXIES,
    "DEFAULT_PARSER_CLASSES": [
        "vclmgr.api.parsers.JSONParser",
        "vclmgr.api.parsers.FormParser",
        "vclmgr.api.parsers.MultiPartParser",
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
    "SERVE_PERMISSIONS": ["vclmgr.api.permissions.SchemaAccess"],
    # The ways to sign in (the throttle at the end of the authentication classes is none).
    "AUTHENTICATION_WHITELIST": [
        "vclmgr.api.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "COMPONENT_SPLIT_REQUEST": True,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "APPEND_COMPONENTS": {
        "securitySchemes": {
            "tokenAuth": {"type": "http", "scheme": "bearer", "description": "An API token (vcl_…)"}
        }
    },
    "SECURITY": [{"tokenAuth": []}, {"cookieAuth": []}],
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "vclmgr.api.schema.add_error_responses",
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

# --- hypervisor drivers and VMs ------------------------------------------------------
# Options for every host of a driver kind, as JSON: {"vmware": {"insecure": true}, "libvirt": {...}}.
# Sockets of local libvirt daemons a libvirt URI may name with ?socket= (comma-separated paths).
VCLMGR_LIBVIRT_SOCKETS = env.list("VCLMGR_LIBVIRT_SOCKETS", [])
VCLMGR_DRIVER_OPTIONS = env.json("VCLMGR_DRIVER_OPTIONS", {}, check=_driver_options_errors)
# Options for every simulated host that win over its own capacity fields, e.g. {"delay": 0.5}.
VCLMGR_SIM_OPTIONS = env.json(
    "VCLMGR_SIM_OPTIONS", {}, check=lambda v: None if isinstance(v, dict) else f"expected a JSON object, got {v!r}"
)
# Concurrent image transfers onto one host, into one blade center, and in all.
VCLMGR_STAGE_PER_HOST = env.int("VCLMGR_STAGE_PER_HOST", 2, minimum=1)
VCLMGR_STAGE_PER_CHASSIS = env.int("VCLMGR_STAGE_PER_CHASSIS", 4, minimum=1)
VCLMGR_STAGE_GLOBAL = env.int("VCLMGR_STAGE_GLOBAL", 16, minimum=1)
# How long vm.create waits for a booted VM to report its address, in seconds.
VCLMGR_ADDRESS_TIMEOUT = env.int("VCLMGR_ADDRESS_TIMEOUT", 120, minimum=1)

# --- placement ------------------------------------------------------------------------
# IAllocator programs the "external" placement policy may run, by name:
# "name=command [options];name=command". Node groups choose one by name, so only whoever
# sets the environment decides what the workers execute.
IALLOCATORS = env.mapping(
    "IALLOCATORS", {"hail": "/usr/lib/ganeti/3.0/usr/lib/ganeti/iallocators/hail"}
)
# The one used when a node group (or a request's policy override) names none; "" for none.
DEFAULT_IALLOCATOR = env.str("DEFAULT_IALLOCATOR", "hail")
if DEFAULT_IALLOCATOR and DEFAULT_IALLOCATOR not in IALLOCATORS:
    raise ImproperlyConfigured(f"DEFAULT_IALLOCATOR {DEFAULT_IALLOCATOR!r} is not one of IALLOCATORS")

# A directory where the input of every refused placement decision is saved for replay
# (as hail's --save); empty: none are saved.
VCLMGR_SAVE_REFUSED_DECISIONS = env.str("VCLMGR_SAVE_REFUSED_DECISIONS", "")

# --- reservations ---------------------------------------------------------------------
# VCL's preload: a future reservation's VM is built this long before its start.
RESERVATION_LEAD_MINUTES = env.int("RESERVATION_LEAD_MINUTES", 10, minimum=0)
# The site's quota defaults (``provisioning.vms.quotas``; rules can only tighten them): the longest
# reservation or ad-hoc VM, and how many of them one user may hold at once.
RESERVATION_MAX_MINUTES = env.int("RESERVATION_MAX_MINUTES", 8 * 60, minimum=1)
RESERVATION_MAX_PER_USER = env.int("RESERVATION_MAX_PER_USER", 3, minimum=1)
# A non-staff user's ad-hoc VM asked for without an end is destroyed after this long (at most
# the longest time the quota allows).
VM_DEFAULT_MINUTES = env.int("VM_DEFAULT_MINUTES", 2 * 60, minimum=1)
# How far ahead a reservation may start, and when the "ending soon" warning goes out.
RESERVATION_HORIZON_DAYS = env.int("RESERVATION_HORIZON_DAYS", 90, minimum=1)
RESERVATION_WARN_MINUTES = env.int("RESERVATION_WARN_MINUTES", 10, minimum=0)
# The scheduler's tick (starts, ends, warnings, block seats), in seconds.
RESERVATION_TICK_SECONDS = env.int("RESERVATION_TICK_SECONDS", 30, minimum=5)

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
HEALTHZ_REQUIRE_WORKERS = env.bool("HEALTHZ_REQUIRE_WORKERS", True)

# --- i18n, static ---------------------------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = env.str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True
STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# --- security -------------------------------------------------------------------------
# Who sees /healthz's per-check details (the status code is public): staff or public.
HEALTHZ_DETAILS = env.choice("HEALTHZ_DETAILS", ("staff", "public"), "staff")
# Who may read /api/v1/schema/ and /api/v1/docs/: users (signed in), staff or public.
API_SCHEMA_ACCESS = env.choice("API_SCHEMA_ACCESS", ("users", "staff", "public"), "users")
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", not DEBUG)
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", not DEBUG)
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", not DEBUG)
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
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
