"""Health checks: 200 when yes, 503 when not.

* ``/healthz``: is every part this installation depends on up (database, broker, channel
  layer, a live job worker anywhere)?
* ``/healthz/live``: this web process answers (a supervisor restarts it when not); no I/O.
* ``/healthz/ready``: this web process can serve (a load balancer sends it traffic): the
  database answers, every migration is applied, and Redis answers when configured. Job
  workers are not its business (``manage.py worker_check`` is theirs).

The status code is for everyone (load balancers); the checks' details (versions, queue
sizes, error texts) only for staff unless ``HEALTHZ_DETAILS=public``."""

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor

from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django_q.brokers import get_broker
from django_q.status import Stat

from accounts import access


def _check(fn):
    try:
        return {"status": "ok", **(fn() or {})}
    except Exception as exc:  # each probe reports its failure instead of failing the page
        return {"status": "down", "error": f"{type(exc).__name__}: {exc}"[:300]}


def _database():
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return {"vendor": connection.vendor}


_migrated = []  # once every migration is applied it stays so for this process's code


def migrations():
    """Raises unless every migration this code knows is applied to the database."""
    if _migrated:
        return {}
    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if plan:
        names = ", ".join(f"{m.app_label}.{m.name}" for m, _ in plan[:3])
        raise RuntimeError(f"{len(plan)} migrations not applied ({names}{', …' if len(plan) > 3 else ''})")
    _migrated.append(True)
    return {}


def redis():
    """Raises if Redis is configured and does not answer; None when it is not configured."""
    if not settings.REDIS_URL:
        return None
    import redis as redis_client

    client = redis_client.Redis.from_url(settings.REDIS_URL, socket_timeout=3, socket_connect_timeout=3)
    try:
        client.ping()
    finally:
        client.close()
    return {}


def _broker():
    broker = get_broker()
    if not broker.ping():
        raise RuntimeError("broker did not answer")
    return {"kind": "redis" if settings.REDIS_URL else "orm", "queued": broker.queue_size()}


def _channel_layer():
    layer = get_channel_layer()

    async def roundtrip():
        channel = await layer.new_channel()
        token = uuid.uuid4().hex
        await layer.send(channel, {"type": "health.ping", "token": token})
        message = await layer.receive(channel)
        if message.get("token") != token:
            raise RuntimeError("channel layer returned a different message")

    # In a thread of its own, with a deadline: the caller's thread may already run an
    # event loop, and a hung layer must not hang the health check.
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, asyncio.wait_for(roundtrip(), 5)).result(timeout=6)
    return {"backend": type(layer).__name__}


def live_worker_count():
    return sum(len(stat.workers or []) for stat in Stat.get_all() if stat.status != "Stopped")


def _workers():
    count = live_worker_count()
    if count == 0 and settings.HEALTHZ_REQUIRE_WORKERS:
        raise RuntimeError("no live worker")
    return {"count": count}


def _answer(request, checks):
    healthy = all(c["status"] == "ok" for c in checks.values())
    body = {"status": "ok" if healthy else "down"}
    if settings.HEALTHZ_DETAILS == "public" or access.can(request.user, "see_cluster"):
        body["checks"] = checks
    return JsonResponse(body, status=200 if healthy else 503)


@never_cache
def live(request):
    return JsonResponse({"status": "ok"})


def ready_checks():
    checks = {"database": _check(_database), "migrations": _check(migrations)}
    if settings.REDIS_URL:
        checks["redis"] = _check(redis)
    return checks


@never_cache
def ready(request):
    return _answer(request, ready_checks())


@never_cache
def healthz(request):
    checks = {
        "database": _check(_database),
        "broker": _check(_broker),
        "channel_layer": _check(_channel_layer),
        "workers": _check(_workers),
    }
    if checks["workers"]["status"] == "down":
        checks["workers"]["count"] = 0
    return _answer(request, checks)
