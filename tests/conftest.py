"""Shared fixtures: personas, API clients with real tokens, real worker and ASGI processes,
and a real websocket client."""

import itertools
import json
import socket
import uuid

import pytest
import urllib3.util.connection
from django.core.cache import caches
from django.test import Client
from pytest_django.fixtures import _set_suffix_to_test_databases
from pytest_django.plugin import blocking_manager_key
from rest_framework.test import APIClient

from accounts import tokens
from capacity.snapshot import snapshot
from core.changelog import Actor
from inventory import services as inventory_services
from tests import processes, template_db
from tests.vcsim import vcsim  # noqa: F401 (the one session fixture of the simulator)

TEST = Actor(name="test")
_numbers = itertools.count(1)

#: Files of items that take minutes each (the topology under load, a real guest left idle, runs
#: suspended and resumed on real QEMU) are sent first: xdist hands items out in this order, so
#: they start at once beside the short ones instead of one worker finishing them alone at the end.
#: (The two-host modules are not: sent first too, their guests and these boot at once on two
#: cores, and `make test` took 38 s longer.)
LONGEST_FIRST = (
    "tests/integration/test_topology.py",
    "tests/integration/test_idle_real_vm.py",
    "tests/integration/test_runs_real_vm.py",
)


#: What a test uses that makes it "heavy": a real QEMU guest, Chromium, the whole API fuzzed, the
#: topology's machines. What they prove does not depend on the database, so CI runs them once, on
#: the PostgreSQL leg (the production configuration); `make test` runs them on SQLite too.
HEAVY_FIXTURES = frozenset({"libvirtd", "two_hosts", "browser"})
HEAVY_FILES = frozenset({"tests/test_api_schema_fuzz.py"})
#: What makes a test "slow": it starts a real process (a worker, a web server, a directory, an
#: identity provider, a BMC, a simulator, a program of Ganeti's or of the system). `make check`
#: runs every test that is neither.
PROCESS_FIXTURES = frozenset({
    "worker", "asgi_server", "ws_connect", "start_workers", "redfish_bmc", "vcsim", "provider", "idp", "vclmgr",
})  # fmt: skip
PROCESS_MODULES = frozenset({"subprocess", "processes"})


def _classify(item):
    path = item.nodeid.split("::", 1)[0]
    names = set(getattr(item, "fixturenames", ()))
    if names & HEAVY_FIXTURES or path in HEAVY_FILES or item.get_closest_marker("topology"):
        item.add_marker(pytest.mark.heavy)
    module = getattr(item, "module", None)
    if (
        item.get_closest_marker("heavy")
        or names & PROCESS_FIXTURES
        or PROCESS_MODULES & set(vars(module) if module else ())
    ):
        item.add_marker(pytest.mark.slow)


def _shares_by_module(item):
    """A test that uses a module-scoped fixture (a process, guests or a server shared by its
    module) goes to the same xdist worker as the rest of its module (`--dist loadgroup`), so the
    module starts its shared things once, not once per worker."""
    info = getattr(item, "_fixtureinfo", None)
    for definitions in info.name2fixturedefs.values() if info else ():
        if any(definition.scope == "module" for definition in definitions):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
            return


def pytest_configure(config):
    # The run's id, known to its controller too (xdist makes one up otherwise): the workers'
    # template database is this run's, and the controller drops only that one.
    if not hasattr(config, "workerinput") and getattr(config.option, "testrunuid", "") is None:
        config.option.testrunuid = uuid.uuid4().hex


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    run_id = getattr(session.config.option, "testrunuid", None)
    if run_id and not hasattr(session.config, "workerinput"):
        with session.config.stash[blocking_manager_key].unblock():
            template_db.remove_template(run_id)


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix, request):
    """pytest-django's hook before the test databases are made: each run's are its own (two runs
    at once, in one checkout or on one PostgreSQL server, would otherwise flush each other's
    rows), and under xdist each worker's is a copy of one migrated template
    (``tests.template_db``)."""
    workerinput = getattr(request.config, "workerinput", None)
    options = workerinput if workerinput is not None else vars(request.config.option)
    run_id = options.get("testrunuid")
    if run_id:
        _set_suffix_to_test_databases(run_id[:8])
    if workerinput is not None:
        template_db.start_from_template(workerinput["testrunuid"])


# First: xdist's worker reads the xdist_group markers in its own hook of this name.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        _classify(item)
        _shares_by_module(item)
    items.sort(key=lambda item: item.nodeid.split("::", 1)[0] not in LONGEST_FIRST)  # stable


@pytest.fixture(scope="session", autouse=True)
def _close_database_pools(django_db_setup, django_db_blocker):
    """On PostgreSQL the test process pools its connections too (as web processes do); close
    the pool before the test database is dropped, or the drop finds it still in use. Sessions
    of this process's other threads (the executors of async code, a job runner's heartbeat)
    live as long as their threads, past the pool: they are ended too, on this worker's own
    test database only."""
    yield
    from django.db import connection, connections

    if connection.vendor == "postgresql":
        with django_db_blocker.unblock(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )

    for conn in connections.all(initialized_only=True):
        if conn.alias in getattr(type(conn), "_connection_pools", {}):  # (reading .pool would open one)
            conn.close_pool()


#: What ``post_migrate`` writes: content types, permissions, the role groups and their permissions.
POST_MIGRATE_TABLES = ("django_content_type", "auth_permission", "auth_group", "auth_group_permissions")


@pytest.fixture(scope="session", autouse=True)
def _post_migrate_rows_put_back():
    """A transactional test ends with a flush of every table, after which Django sends
    ``post_migrate`` so that its receivers write their rows again: about 0.1 s of queries per
    test, and always the same rows. The first flush of a database sends it; the rows it wrote
    are copied then, and put back after each later flush in a few inserts instead."""
    from django.core.management.color import no_style
    from django.core.management.commands import flush
    from django.db import connections

    original = flush.emit_post_migrate_signal
    saved = {}

    def put_back(verbosity, interactive, db, **kwargs):
        conn = connections[db]
        with conn.cursor() as cursor:
            if db not in saved:
                original(verbosity, interactive, db, **kwargs)
                saved[db] = {}
                for table in POST_MIGRATE_TABLES:
                    cursor.execute(f"SELECT * FROM {conn.ops.quote_name(table)}")  # noqa: S608 (our table names)
                    columns = [conn.ops.quote_name(column[0]) for column in cursor.description]
                    saved[db][table] = (columns, cursor.fetchall())
                return
            for table, (columns, rows) in saved[db].items():
                if rows:
                    cursor.executemany(
                        f"INSERT INTO {conn.ops.quote_name(table)} ({', '.join(columns)})"  # noqa: S608
                        f" VALUES ({', '.join(['%s'] * len(columns))})",
                        rows,
                    )
            # Rows put back with their ids leave PostgreSQL's sequences where they were, which a
            # test that made these tables again (a migration back and forth) set back: past them.
            for statement in conn.ops.sequence_reset_sql(no_style(), _post_migrate_models()):
                cursor.execute(statement)

    flush.emit_post_migrate_signal = put_back
    yield
    flush.emit_post_migrate_signal = original


def _post_migrate_models():
    from django.contrib.auth.models import Group, Permission
    from django.contrib.contenttypes.models import ContentType

    return [ContentType, Permission, Group, Group.permissions.through]


@pytest.fixture(scope="session", autouse=True)
def _flush_by_delete_on_postgresql():
    """On PostgreSQL Django flushes with one TRUNCATE of every table, which makes new files for
    each table and index: 0.4 to 2 s per transactional test here. The tables a test leaves hold
    a few rows, which DELETE removes in milliseconds (its foreign keys are deferred, so the order
    does not matter). Sequences are reset the TRUNCATE way when a test asks for it."""
    from django.db.backends.postgresql.operations import DatabaseOperations

    original = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or allow_cascade:
            return original(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        return [f"{style.SQL_KEYWORD('DELETE FROM')} {style.SQL_FIELD(self.quote_name(table))};" for table in tables]

    DatabaseOperations.sql_flush = sql_flush
    yield
    DatabaseOperations.sql_flush = original


@pytest.fixture(autouse=True)
def _fresh_throttle():
    caches["throttle"].clear()


@pytest.fixture(autouse=True)
def _fresh_snapshot():
    """Each process keeps one placement snapshot; a test starts and ends with an empty one, so
    no test sees hosts another test made."""
    snapshot.reset()
    yield
    snapshot.reset()


@pytest.fixture
def migrated_schedules(db):
    """The periodic schedules as the data migrations write them at `migrate`: a transactional
    test that ran before on the same worker emptied every table, theirs included."""
    from importlib import import_module

    from django.apps import apps

    for module in ("jobs.migrations.0002_job_sweep_schedule", "provisioning.migrations.0002_facts_refresh_schedule"):
        import_module(module).create(apps, None)


@pytest.fixture
def admin_user(django_user_model):
    return django_user_model.objects.create_user(
        "admin", "admin@example.org", "admin-pass-1", is_staff=True, is_superuser=True
    )


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice", "alice@example.org", "alice-pass-1")


@pytest.fixture
def bob(django_user_model):
    return django_user_model.objects.create_user("bob", "bob@example.org", "bob-pass-1")


@pytest.fixture
def make_approver(django_user_model):
    """``make_approver(group)`` → carol, an approver of ``group``'s members' requests."""

    def make(group):
        from accounts import access

        carol = django_user_model.objects.create_user("carol", "carol@example.org", "carol-pass-1")
        carol.groups.add(group)
        access.set_roles(carol, ["approver"], actor="test")
        return carol

    return make


@pytest.fixture
def api():
    """``api(user, write=True)`` → an APIClient authenticated with a fresh real token."""

    def make(user=None, write=True):
        client = APIClient()
        if user is not None:
            _, clear = tokens.issue(user, f"test-{next(_numbers)}", scopes="all" if write else ("read",))
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {clear}")
        return client

    return make


@pytest.fixture
def worker(transactional_db, tmp_path):
    """A real django-q2 cluster process on the test database."""
    child = processes.start_worker(tmp_path)
    yield child
    child.stop()


@pytest.fixture
def asgi_server(transactional_db, tmp_path):
    """A real daphne process serving vclmgr on a free port."""
    child = processes.start_asgi(tmp_path)
    yield child
    child.stop()


@pytest.fixture
def session_cookie(transactional_db):
    """``session_cookie(user)`` → a Cookie header value for a logged-in session."""

    def make(user):
        client = Client()
        client.force_login(user)
        return f"sessionid={client.cookies['sessionid'].value}"

    return make


class WsClient:
    """A real websocket client (the ``websockets`` library) speaking the events protocol."""

    def __init__(self, connection):
        self.connection = connection

    def send(self, message):
        self.connection.send(json.dumps(message))

    def receive(self, timeout=5):
        return json.loads(self.connection.recv(timeout=timeout))

    def receive_until(self, predicate, timeout=5):
        import time

        deadline = time.monotonic() + timeout
        while True:
            message = self.receive(timeout=max(0.01, deadline - time.monotonic()))
            if predicate(message):
                return message

    def subscribe(self, topics, since=None):
        """Subscribe to ``topics`` (events after the id ``since``, if given); the server's
        ``subscribed`` answer (which topics it granted, which it denied)."""
        message = {"action": "subscribe", "topics": list(topics)}
        if since is not None:
            message["since"] = since
        self.send(message)
        return self.receive_until(lambda m: m["type"] == "subscribed")

    def close(self):
        self.connection.close()


@pytest.fixture
def ws_connect(asgi_server):
    """``ws_connect(path, cookie=None, headers=None, origin=None, no_origin=False)`` → a connected
    WsClient (sending this server's Origin unless told another or none)."""
    from websockets.sync.client import connect

    opened = []

    def make(path="/ws/events/", cookie=None, headers=None, origin=None, no_origin=False):
        extra = dict(headers or {})
        if cookie:
            extra["Cookie"] = cookie
        client = WsClient(
            connect(
                f"ws://127.0.0.1:{asgi_server.port}{path}",
                additional_headers=extra,
                origin=None if no_origin else origin or f"http://127.0.0.1:{asgi_server.port}",
                open_timeout=10,
            )
        )
        opened.append(client)
        return client

    yield make
    for client in opened:
        client.close()


@pytest.fixture
def ws_refusal(asgi_server):
    """``ws_refusal(path, cookie=None)`` → (close code, [text messages]) of a websocket the server
    closes at once. The frames are parsed without ever answering the close: the ``websockets``
    client drops frames it read together with the close when its close reply meets a reset
    connection, and a refusal's reason travels in the text frame just before the close."""
    import socket

    from websockets.client import ClientProtocol
    from websockets.frames import Opcode
    from websockets.uri import parse_uri

    def refuse(path, cookie=None):
        port = asgi_server.port
        protocol = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}{path}"), origin=f"http://127.0.0.1:{port}")
        request = protocol.connect()
        if cookie:
            request.headers["Cookie"] = cookie
        protocol.send_request(request)
        texts = []
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            for data in protocol.data_to_send():
                sock.sendall(data)
            while protocol.close_rcvd is None:
                data = sock.recv(65536)
                if not data:
                    break
                protocol.receive_data(data)
                events = protocol.events_received()
                texts += [e.data.decode() for e in events if getattr(e, "opcode", None) is Opcode.TEXT]
        assert protocol.close_rcvd is not None, f"the server did not close the websocket; it said {texts}"
        return protocol.close_rcvd.code, texts

    return refuse


# --- inventory objects, made through the services -----------------------------------


@pytest.fixture
def group(db):
    return inventory_services.create_node_group(actor=TEST, name="lab", alloc_policy="preferred")


@pytest.fixture
def chassis(db):
    return inventory_services.create_blade_center(actor=TEST, name="bc1", slot_count=16, site="room 1")


@pytest.fixture
def credential(db):
    return inventory_services.create_credential(
        actor=TEST,
        name="root-ssh",
        username="root",
        secret="hunter2-very-secret",  # noqa: S106
    )


@pytest.fixture
def make_host(db):
    def make(name=None, tags=(), **fields):
        n = next(_numbers)
        values = {
            "name": name or f"host{n:04d}",
            "address": f"10.1.{n // 250}.{n % 250 + 1}",
            "driver": "sim",
            "cpus": 16,
            "memory_mib": 65536,
            "disk_gib": 500,
        }
        values.update(fields)
        return inventory_services.create_hypervisor(actor=TEST, tags=tags, **values)

    return make


@pytest.fixture
def sim_host(make_host):
    """A simulated host of 8 CPUs and 8 GiB: room for a few small VMs."""
    return make_host("sim-1", driver="sim", cpus=8, memory_mib=8192, disk_gib=200)


# --- a Redfish BMC: sushy-emulator, one per test (it starts in ~0.5 s) ---------------------


@pytest.fixture
def redfish_bmc(tmp_path, settings):
    """``redfish_bmc({"node-1": "on", ...}, tls=True)`` → a running ``tests.redfish.Emulator``
    whose fake systems have those names and power states; stopped by PID after the test.
    127.0.0.1 is allow-listed for the test (refused by default: it is no public address)."""
    from tests.redfish import Emulator

    settings.VCLMGR_OUTBOUND_ALLOW = ["127.0.0.1"]

    started = []

    def start(systems, tls=True, min_delay=0):
        emulator = Emulator(tmp_path / f"bmc{len(started)}", dict(systems), tls=tls, min_delay=min_delay)
        started.append(emulator)
        return emulator.start()

    yield start
    for emulator in started:
        emulator.stop()


@pytest.fixture
def bmc_host(db):
    """``bmc_host(host, emulator, system_name, password=…)``: point a host at an emulator's system
    with a credential saved for that address."""
    from tests import redfish

    def point(host, emulator, name, password=redfish.PASSWORD, **fields):
        credential = inventory_services.create_credential(
            actor=TEST,
            name=f"bmc-{host.name}-{next(_numbers)}",
            username=redfish.USERNAME,
            secret=password,
            endpoints=[fields.get("bmc_address", emulator.url)],
        )
        values = {
            "bmc_address": emulator.url,
            "bmc_credential": credential,
            "bmc_system": emulator.systems[name],
            "bmc_verify_tls": False,
            **fields,
        }
        return inventory_services.update_hypervisor(host, actor=TEST, **values)

    return point


# --- outbound requests ---------------------------------------------------------------------


@pytest.fixture
def connects(monkeypatch):
    """Every connection attempt (urllib3's and the socket module's) recorded, and refused unless
    to 127.0.0.1: a test of a refused target shows that nothing was even tried."""
    seen = []

    def recorder(real):
        def connect(address, *args, **kwargs):
            seen.append(address[0])
            if address[0] != "127.0.0.1":
                raise AssertionError(f"a connection to {address} was attempted")
            return real(address, *args, **kwargs)

        return connect

    monkeypatch.setattr(
        urllib3.util.connection, "create_connection", recorder(urllib3.util.connection.create_connection)
    )
    monkeypatch.setattr(socket, "create_connection", recorder(socket.create_connection))
    return seen


@pytest.fixture
def upload_stores():
    """The upload and image-store folders (tests' settings: one per worker), emptied afterwards:
    for tests whose server or worker processes store uploads where the settings say."""
    import shutil

    from django.conf import settings

    yield settings.IMAGE_UPLOAD_DIR, settings.IMAGE_STORE_DIR
    for folder in (settings.IMAGE_UPLOAD_DIR, settings.IMAGE_STORE_DIR):
        shutil.rmtree(folder, ignore_errors=True)
