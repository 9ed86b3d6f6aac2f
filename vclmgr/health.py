"""``/healthz``: is every part this process depends on up? 200 when yes, 503 when not.

The status code is for everyone (load balancers); the checks' details (versions, queue
sizes, error texts) only for staff unless ``HEALTHZ_DETAILS=public``."""

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor

from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django_q.brokers import get_broker
from django_q.status import Stat


def _check(fn):
    try:
        return {"status": "ok", **(fn() or {})}
    except Exception as exc:  # each probe reports its failure instead of failing the page
        return {"status": "down", "error": f"{type(exc).__name__}: {exc}"[:300]}


def _database():
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return {"vendor": connection.vendor}


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
    healthy = all(c["status"] == "ok" for c in checks.values())
    body = {"status": "ok" if healthy else "down"}
    if settings.HEALTHZ_DETAILS == "public" or request.user.is_staff:
        body["checks"] = checks
    return JsonResponse(body, status=200 if healthy else 503)
