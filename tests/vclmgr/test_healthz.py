import os

import pytest
from django.db import connection


@pytest.mark.django_db
def test_it_reports_down_without_a_live_worker(client, admin_user):
    client.force_login(admin_user)
    response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["checks"]["database"]["status"] == "ok"
    assert body["checks"]["broker"]["status"] == "ok"
    assert body["checks"]["channel_layer"]["status"] == "ok"
    assert body["checks"]["workers"] == {"status": "down", "error": "RuntimeError: no live worker", "count": 0}


@pytest.mark.django_db
def test_its_details_are_for_staff_only(client, alice, settings):
    """Versions, queue sizes and error texts help an attacker; the status code is for load balancers."""
    assert client.get("/healthz").json() == {"status": "down"}
    client.force_login(alice)
    response = client.get("/healthz")
    assert (response.status_code, response.json()) == (503, {"status": "down"})
    settings.HEALTHZ_DETAILS = "public"
    client.logout()
    assert client.get("/healthz").json()["checks"]["database"]["status"] == "ok"


@pytest.mark.slow
def test_it_is_healthy_with_a_real_worker(client, worker, admin_user):
    client.force_login(admin_user)
    response = client.get("/healthz")
    assert response.status_code == 200, response.json()
    assert response.json()["checks"]["workers"]["count"] >= 1


@pytest.mark.django_db
def test_the_suite_runs_on_the_database_it_was_asked_for():
    """The PostgreSQL leg of CI must not silently fall back to SQLite."""
    expected = "postgresql" if os.environ.get("DATABASE_URL", "").startswith("postgres") else "sqlite"
    assert connection.vendor == expected
    from django.conf import settings

    if os.environ.get("REDIS_URL"):
        assert settings.Q_CLUSTER.get("redis") and "Redis" in settings.CHANNEL_LAYERS["default"]["BACKEND"]
