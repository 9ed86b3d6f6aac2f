"""The settings of test runs: the product's (vclmgr/settings.py, read from the same environment),
plus what only tests want. Processes the tests start (tests/processes.py) use this module too.

- Parallel test workers (pytest-xdist) and the processes each starts share one machine: the
  worker's id keeps their queues, caches and metrics apart.
- Passwords are hashed cheaply (a real hasher costs ~0.5 s per persona); PBKDF2 stays second so
  a hash made the product's way still verifies.
- The SQLite test database is a file, so the worker and web processes a test starts see it;
  ``VCLMGR_TEST_DB=memory`` (``make check``, which starts none) keeps it in memory.
"""

import os

_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker:
    os.environ.setdefault("VCLMGR_QUEUE_NAME", f"vclmgr-{_worker}")
    # The runner exported its own default before it started the workers; each worker (and what
    # it starts, which inherits both variables) keeps its own.
    if os.environ.get("VCLMGR_TEST_METRICS_OWNER") != _worker:
        _var = os.environ.get("VCLMGR_VAR_DIR") or os.path.join(os.path.dirname(os.path.dirname(__file__)), "var")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = os.path.join(_var, f"metrics-{_worker}")
        os.environ["VCLMGR_TEST_METRICS_OWNER"] = _worker

    # Each worker its own Redis database: a test's cache.clear() (FLUSHDB) must not empty the
    # other worker's throttle counters, cluster stats or queue halfway through its test.
    _redis = os.environ.get("REDIS_URL", "")
    if _redis.startswith("redis://") and os.environ.get("VCLMGR_TEST_REDIS_OWNER") != _worker:
        from urllib.parse import urlsplit, urlunsplit

        _number = int("".join(ch for ch in _worker if ch.isdigit()) or 0) + 1
        os.environ["REDIS_URL"] = urlunsplit(urlsplit(_redis)._replace(path=f"/{_number}"))
        os.environ["VCLMGR_TEST_REDIS_OWNER"] = _worker

from vclmgr.settings import *  # noqa: E402,F403
from vclmgr.settings import DATABASES, VAR_DIR  # noqa: E402

PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.MD5PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
]

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3" and os.environ.get("VCLMGR_TEST_DB") != "memory":
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # A test database need not survive a crash: a commit does not wait for its WAL to reach the
    # disk (a session setting; the server's own configuration is left alone). Transactional
    # tests and the processes they start commit often, and waited on fsync for each.
    DATABASES["default"].setdefault("OPTIONS", {})["options"] = "-c synchronous_commit=off"

# The real-VM idle test proves no-show and idle reclamation with limits of one minute: the
# worker it starts counts a policy's minute as this many seconds.
IDLE_MINUTE_SECONDS = int(os.environ.get("VCLMGR_TEST_IDLE_MINUTE_SECONDS", "60"))

# Uploaded disks the tests send (the API fuzz's too) stay out of the development server's folders.
IMAGE_UPLOAD_DIR = VAR_DIR / f"test-uploads{_worker}"
IMAGE_STORE_DIR = VAR_DIR / f"test-images{_worker}"
