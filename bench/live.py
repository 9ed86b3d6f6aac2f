"""Live events: commit-to-receipt latency over websockets, 1,000 clients on one ASGI process.

    python bench/live.py [--clients 1000] [--rounds 20] [--interval 1.0] [--configs embedded,redis]
                         [--redis-url URL] [--database-url postgres://…/DISPOSABLE]

For each configuration it starts a fresh database, creates ``--clients`` users (half staff),
starts ONE daphne process (as ``manage.py serve`` does) and opens one websocket per user with
its session cookie: the staff half subscribe to the shared ``admin`` topic, the other half each
to their own ``user.<id>``. A separate worker process then makes ``--rounds`` rounds of state
changes, each in its own ``transaction.atomic()`` and timed at its commit: one change on
``admin`` (reaches every staff client) and one on each ``user.<id>`` (reaches its owner).
Reported: deliveries received / expected (every client must get every event of its topic,
nothing else, once), and the latency from commit to receipt, p50/p99/max, per topic kind.

Configurations: ``embedded`` (SQLite, in-memory channel layer: the default install) and
``redis`` (channels-redis layer; on PostgreSQL when ``--database-url`` is given, else SQLite).
``--database-url`` must name a disposable database: the bench empties its event table.
Targets: 100 % delivered, p99 < 1 s.
"""

import argparse
import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from _common import (  # bench/ is on the script's path
    ROOT,
    child_env,
    free_port,
    percentile,
    run_child,
    setup_django,
    start_daphne,
)

SHARED_TOPIC = "admin"
CONNECT_CONCURRENCY = 20
CONNECT_ATTEMPTS = 5


def load():
    return os.getloadavg()[0]


def raise_open_files_limit(wanted):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# --- the worker process: state changes, timed at commit ------------------------------------


def emit_rounds(args):
    """Runs in its own process: ``--rounds`` rounds of changes; prints {event id: [topic, commit time]}."""
    setup_django()
    from django.db import transaction

    from core import events

    user_topics = json.loads(Path(args.topics_file).read_text())
    committed = {}
    start = time.monotonic()
    for index in range(args.rounds):
        time.sleep(max(0.0, start + index * args.interval - time.monotonic()))
        for topic in [SHARED_TOPIC, *user_topics]:
            with transaction.atomic():
                (row,) = events.emit("bench.step", {"round": index}, [topic])
            committed[row.id] = [topic, time.time()]
    print(json.dumps(committed), flush=True)


# --- the client process: users, daphne, websockets ---------------------------------------------


def make_users(count):
    """Half staff (shared topic), half regular (own topic); returns [(cookie, topic)]."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.hashers import make_password
    from django.test import Client

    from core.models import Event

    User = get_user_model()
    unusable = make_password(None)
    User.objects.filter(username__startswith="bench-live-").delete()
    Event.objects.all().delete()
    staff = count // 2
    users = User.objects.bulk_create(
        [User(username=f"bench-live-{n:05d}", is_staff=n < staff, password=unusable) for n in range(count)]
    )
    users = list(User.objects.filter(username__startswith="bench-live-").order_by("username"))
    pairs = []
    for user in users:
        client = Client()
        client.force_login(user)
        topic = SHARED_TOPIC if user.is_staff else f"user.{user.pk}"
        pairs.append((f"sessionid={client.cookies['sessionid'].value}", topic))
    return pairs


def start_web(port, log_path):
    log = open(log_path, "wb")  # noqa: SIM115 (the child keeps it)
    return start_daphne(port, log)


async def open_subscribed(port, cookie, topic, opened):
    """Connect and subscribe; a refused or dropped handshake is retried, as a browser does."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidHandshake, WebSocketException

    for attempt in range(CONNECT_ATTEMPTS):
        try:
            ws = await connect(
                f"ws://127.0.0.1:{port}/ws/events/",
                additional_headers={"Cookie": cookie},
                origin=f"http://127.0.0.1:{port}",
                proxy=None,
                open_timeout=60,
                ping_interval=None,
                max_queue=None,
            )
            await ws.send(json.dumps({"action": "subscribe", "topics": [topic]}))
            while True:
                reply = json.loads(await ws.recv())
                if reply["type"] == "subscribed":
                    break
        except (InvalidHandshake, WebSocketException, OSError, TimeoutError):
            if attempt == CONNECT_ATTEMPTS - 1:
                raise
            opened["retries"] += 1
            await asyncio.sleep(0.5 * (attempt + 1))
            continue
        if reply["topics"] != [topic]:
            raise SystemExit(f"subscription to {topic} refused: {reply}")
        return ws


async def run_client(port, client, cookie, topic, opened, received):
    async with opened["gate"]:
        ws = await open_subscribed(port, cookie, topic, opened)
    opened["count"] += 1
    if opened["count"] == opened["total"]:
        opened["all"].set()
    try:
        while True:
            raw = await ws.recv()
            now = time.time()  # before parsing: the client's own work is not the server's delay
            message = json.loads(raw)
            if message["type"] == "event":
                received.append((client, topic, message["id"], message["topic"], now))
    except asyncio.CancelledError:
        pass
    finally:
        await ws.close()


async def measure(args, pairs, port, topics_file):
    opened = {
        "gate": asyncio.Semaphore(CONNECT_CONCURRENCY),
        "count": 0,
        "total": len(pairs),
        "all": asyncio.Event(),
        "retries": 0,
    }
    received = []
    t0 = time.monotonic()
    tasks = [
        asyncio.create_task(run_client(port, client, cookie, topic, opened, received))
        for client, (cookie, topic) in enumerate(pairs)
    ]
    waiter = asyncio.create_task(opened["all"].wait())
    done, _ = await asyncio.wait([waiter, *tasks], timeout=600, return_when=asyncio.FIRST_COMPLETED)
    if waiter not in done:
        for task in done:
            task.result()  # a client failed: raise its error
        raise SystemExit(f"only {opened['count']} of {len(pairs)} clients subscribed")
    connect_s = time.monotonic() - t0
    load_before = load()
    emitter = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--emit",
        "--rounds",
        str(args.rounds),
        "--interval",
        str(args.interval),
        "--topics-file",
        topics_file,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await emitter.communicate()
    if emitter.returncode:
        raise SystemExit("the emitting worker failed")
    committed = {int(k): v for k, v in json.loads(out.decode().strip().splitlines()[-1]).items()}
    subscribers = Counter(topic for _, topic in pairs)
    expected = sum(subscribers[topic] for topic, _ in committed.values())
    deadline = time.monotonic() + args.grace
    while len(received) < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    load_after = load()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    result = report(args, pairs, committed, received, expected, connect_s, load_before, load_after)
    result["connect_retries"] = opened["retries"]
    return result


def report(args, pairs, committed, received, expected, connect_s, load_before, load_after):
    seen = Counter((client, event_id) for client, _, event_id, _, _ in received)
    wrong = sum(1 for _, client_topic, _, event_topic, _ in received if client_topic != event_topic)
    latencies = {"shared": [], "own": []}
    for _, _, event_id, event_topic, at in received:
        if event_id in committed and committed[event_id][0] == event_topic:
            kind = "shared" if event_topic == SHARED_TOPIC else "own"
            latencies[kind].append(at - committed[event_id][1])
    unique = len(received) - sum(n - 1 for n in seen.values()) - wrong
    every = latencies["shared"] + latencies["own"]
    return {
        "clients": len(pairs),
        "shared_subscribers": sum(1 for _, topic in pairs if topic == SHARED_TOPIC),
        "events": len(committed),
        "expected": expected,
        "delivered_pct": round(100 * unique / expected, 2) if expected else 0.0,
        "duplicates": sum(n - 1 for n in seen.values()),
        "foreign": wrong,
        "p50_s": round(percentile(every, 0.5), 3),
        "p99_s": round(percentile(every, 0.99), 3),
        "max_s": round(max(every, default=float("nan")), 3),
        "shared_p99_s": round(percentile(latencies["shared"], 0.99), 3),
        "own_p99_s": round(percentile(latencies["own"], 0.99), 3),
        "connect_s": round(connect_s, 1),
        "load_1m": f"{load_before:.2f}->{load_after:.2f}",
    }


def one(args):
    """Runs in a child process whose environment selects the database and channel layer."""
    raise_open_files_limit(4 * args.clients + 1024)  # client sockets here, daphne's inherit it
    setup_django()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    pairs = make_users(args.clients)
    var = Path(os.environ["VCLMGR_VAR_DIR"])
    topics_file = var / "user-topics.json"
    topics_file.write_text(json.dumps(sorted({topic for _, topic in pairs} - {SHARED_TOPIC})))
    port = free_port()
    daphne = start_web(port, var / "daphne.log")
    try:
        result = asyncio.run(measure(args, pairs, port, str(topics_file)))
    except BaseException:
        log = (var / "daphne.log").read_text(errors="replace").splitlines()
        print("\n".join(line for line in log if not line.startswith("127.0.0.1:"))[-6000:], file=sys.stderr)
        raise
    finally:
        os.killpg(daphne.pid, signal.SIGTERM)
        try:
            daphne.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(daphne.pid, signal.SIGKILL)
            daphne.wait()
    result["config"] = args.label
    print(json.dumps(result), flush=True)


# --- the driver --------------------------------------------------------------------------------


def configurations(args):
    runs = []
    for name in args.configs.split(","):
        if name == "embedded":
            runs.append(("embedded (sqlite)", {"REDIS_URL": "", "DATABASE_URL": ""}))
        elif name == "redis":
            database = "postgres" if args.database_url else "sqlite"
            runs.append((f"redis ({database})", {"REDIS_URL": args.redis_url, "DATABASE_URL": args.database_url or ""}))
        else:
            raise SystemExit(f"--configs: unknown configuration {name!r} (embedded, redis)")
    return runs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between rounds of changes")
    parser.add_argument("--grace", type=float, default=15.0, help="seconds to wait for stragglers")
    parser.add_argument("--configs", default="embedded,redis")
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL"),
        help="PostgreSQL for the redis configuration (disposable: its events are deleted)",
    )
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--label", help=argparse.SUPPRESS)
    parser.add_argument("--emit", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--topics-file", help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args()
    if args.emit:
        emit_rounds(args)
        return
    if args.one:
        one(args)
        return
    results = []
    for label, extra in configurations(args):
        with tempfile.TemporaryDirectory(prefix="vclmgr-bench-live-") as var:
            queue = f"bench-live-{os.getpid()}"
            env = child_env(var, label, ALLOWED_HOSTS="127.0.0.1", VCLMGR_QUEUE_NAME=queue, **extra)
            command = [
                sys.executable,
                __file__,
                "--one",
                "--label",
                label,
                "--clients",
                str(args.clients),
                "--rounds",
                str(args.rounds),
                "--interval",
                str(args.interval),
                "--grace",
                str(args.grace),
            ]
            print(f"running {label} …", file=sys.stderr, flush=True)
            results.append(run_child(command, env, label))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    keys = [
        "config",
        "clients",
        "events",
        "expected",
        "delivered_pct",
        "duplicates",
        "foreign",
        "p50_s",
        "p99_s",
        "max_s",
        "shared_p99_s",
        "own_p99_s",
        "load_1m",
    ]
    print(
        f"{args.clients} websocket clients on one daphne process ({args.clients // 2} on '{SHARED_TOPIC}'), "
        f"{args.rounds} rounds every {args.interval:g} s; targets: 100 % delivered, p99 < 1 s"
    )
    print(" | ".join(keys))
    for row in results:
        print(" | ".join(str(row[k]) for k in keys))
    if any(row["delivered_pct"] < 100 or row["duplicates"] or row["foreign"] for row in results):
        sys.exit("live events: some events were lost, duplicated or sent to the wrong client")


if __name__ == "__main__":
    main()
