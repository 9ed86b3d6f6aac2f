"""Real processes for tests: a django-q2 worker cluster and an ASGI server (daphne),
pointed at the test database so they see what the test writes (use ``transactional_db``).

A process may serve a whole module (``shared``): each test then calls ``Child.begin`` so that
``output()`` holds only what the process logged during that test, and the module uses
``committed_db`` as its ``transactional_db``.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from core import lifeline

ROOT = Path(__file__).resolve().parent.parent


def test_database_url():
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    user = db.get("USER") or "postgres"
    host = db.get("HOST") or "127.0.0.1"
    return f"postgres://{user}@{host}:{db.get('PORT') or 5432}/{db['NAME']}"


def child_env(**extra):
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": test_database_url(),
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "VCLMGR_QUEUE_NAME": settings.Q_CLUSTER["name"],
            "DEBUG": "1",
            "PYTHONUNBUFFERED": "1",
            # The listeners tests start (webhook receivers, BMC emulators) are on 127.0.0.1,
            # which the outbound policy refuses by default.
            "VCLMGR_OUTBOUND_ALLOW": "127.0.0.1",
        }
    )
    if settings.REDIS_URL:
        env["REDIS_URL"] = settings.REDIS_URL
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_python(code, timeout=60, **env):
    """``python -c code`` in a child on the test database (``child_env``), to its end: the
    finished process, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=child_env(**env), capture_output=True, text=True, timeout=timeout
    )


def settings_child(code, **env):
    """``python -c code`` on the product's settings (``vclmgr.settings``, DEBUG on) in a bare
    environment plus ``env``, to its end: how a start with these variables goes."""
    base = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "DEBUG": "1", "DJANGO_SETTINGS_MODULE": "vclmgr.settings"}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=60
    )


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listens(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class Child:
    """A child process in its own session, killed with everything it spawned; and if the test
    process dies before it can (a run killed by a timeout), the whole tree stops by itself:
    it watches a lifeline pipe whose only write end this process holds (``core.lifeline``,
    as ``serve``'s children do)."""

    def __init__(self, args, env, log_path):
        self.log_path = log_path
        self._start = 0
        self.log = open(log_path, "wb")  # noqa: SIM115 (closed in stop)
        read_fd, self._lifeline, value = lifeline.open_pipe()
        try:
            self.proc = subprocess.Popen(
                args,
                cwd=ROOT,
                env={**env, lifeline.ENV: value},
                stdout=self.log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(read_fd,),
            )
        finally:
            os.close(read_fd)

    @property
    def pid(self):
        return self.proc.pid

    def begin(self):
        """From now on ``output()`` is what the process logs next (a test of a shared process)."""
        self.log.flush()
        self._start = Path(self.log_path).stat().st_size
        return self

    def output(self):
        self.log.flush()
        with open(self.log_path, "rb") as log:
            log.seek(self._start)
            return log.read().decode(errors="replace")

    def alive(self):
        return self.proc.poll() is None

    def kill(self):
        """``stop`` without the graceful part, for a test that is not about how the process stops."""
        self.stop(signal.SIGKILL)

    def stop(self, sig=signal.SIGTERM, timeout=10):
        if self.proc.poll() is None:
            try:
                # The leader only: qcluster stops its own pool; the group is killed after.
                self.proc.send_signal(sig)
                self.proc.wait(timeout=timeout)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        # The group's other members (worker pool, relay) die asynchronously; until they are
        # gone their database sessions block dropping the test database at the end.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        self.log.close()
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None


def wait_for(predicate, timeout, what, child=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if child is not None and not child.alive():
            raise AssertionError(f"{what}: process exited early:\n{child.output()[-3000:]}")
        time.sleep(0.1)
    detail = f"\n{child.output()[-3000:]}" if child is not None else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}{detail}")


def start_worker(tmp_path, workers=1, **env):
    from django_q.brokers import get_broker

    from monitoring.health import live_worker_count

    # With Redis the queue outlives the test database: drop tasks an earlier test left.
    get_broker().purge_queue()
    child = Child(
        [sys.executable, "manage.py", "qcluster"], child_env(VCLMGR_WORKERS=workers, **env), tmp_path / "worker.log"
    )
    wait_for(lambda: live_worker_count() >= workers, 30, "the worker cluster to report its workers", child)
    return child


def start_asgi(tmp_path, tls=None, port=None, **env):
    """daphne on a free loopback port (or ``port``, for a server that must know its URL before
    it starts); ``tls=(cert_file, key_file)`` serves HTTPS (Twisted's TLS)."""
    port = port or free_port()
    if tls:
        cert, key = tls
        listen = ["-e", f"ssl:{port}:interface=127.0.0.1:privateKey={key}:certKey={cert}"]
    else:
        listen = ["-b", "127.0.0.1", "-p", str(port)]
    child = Child(
        [sys.executable, "-m", "vclmgr.asgi_server", *listen, "vclmgr.asgi:application"],
        child_env(**env),
        tmp_path / "asgi.log",
    )

    wait_for(lambda: listens(port), 30, "daphne to listen", child)
    child.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    child.port = port
    return child


def start_redis(tmp_path):
    """A private redis-server on a free loopback port (no disk writes); ``.url`` to reach it."""
    port = free_port()
    child = Child(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        dict(os.environ),
        tmp_path / "redis.log",
    )

    wait_for(lambda: listens(port), 15, "redis-server to listen", child)
    child.url = f"redis://127.0.0.1:{port}/0"
    return child


#: What a process caches for its lifetime and ``committed_db`` therefore keeps: content types
#: (Django caches their ids; the change log and permissions refer to them) and the permissions.
KEPT_TABLES = frozenset({"django_content_type", "auth_permission"})


@pytest.fixture
def committed_db(django_db_setup, django_db_blocker):
    """``transactional_db`` for a module whose tests share a process (import it under that
    name, and ``committed_db_too`` as ``db``): the test's writes are committed, and the tables
    emptied after it — all but ``KEPT_TABLES``. pytest-django's flush empties those too and
    makes them anew with new ids, which a process that outlives the test still holds in its
    caches."""

    from django.core.management.color import no_style

    with django_db_blocker.unblock():
        yield
        tables = set(connection.introspection.django_table_names(only_existing=True, include_views=False))
        connection.ops.execute_sql_flush(connection.ops.sql_flush(no_style(), sorted(tables - KEPT_TABLES)))


@pytest.fixture
def committed_db_too(transactional_db):
    """``db`` for a module whose ``transactional_db`` is ``committed_db`` (import it under that
    name): what asks for ``db`` (``django_user_model`` does) gets the same, not pytest-django's
    flush."""


def shared(start, **env):
    """A module-scoped fixture: one process, ``start(directory, **env)``, for all of a module's
    tests — for tests about what the process does with the data, not about starting it. It
    starts once the test database exists; each test still takes ``transactional_db`` (so the
    process sees what the test writes, and the tables are emptied after it) and calls
    ``begin()``."""

    @pytest.fixture(scope="module")
    def fixture(django_db_setup, django_db_blocker, tmp_path_factory):
        with django_db_blocker.unblock():
            child = start(tmp_path_factory.mktemp("shared"), **env)
        try:
            yield child
        finally:
            child.kill()

    return fixture
