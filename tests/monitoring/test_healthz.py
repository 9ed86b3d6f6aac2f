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


@pytest.mark.django_db
def test_live_answers_without_touching_anything(client, django_assert_num_queries):
    with django_assert_num_queries(0):
        response = client.get("/healthz/live")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


@pytest.mark.django_db
def test_ready_needs_the_database_and_migrations_but_no_worker(client, settings):
    settings.HEALTHZ_DETAILS = "public"
    response = client.get("/healthz/ready")
    assert response.status_code == 200, response.json()
    assert response.json()["checks"]["migrations"] == {"status": "ok"}


@pytest.mark.django_db
def test_ready_is_down_when_the_configured_redis_does_not_answer(client, settings):
    from tests.processes import free_port

    settings.HEALTHZ_DETAILS = "public"
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    response = client.get("/healthz/ready")
    assert response.status_code == 503
    assert response.json()["checks"]["redis"]["status"] == "down"


@pytest.mark.django_db
def test_ready_is_down_while_a_migration_is_unapplied(client, settings):
    from django.db.migrations.recorder import MigrationRecorder

    from monitoring import health

    health._migrated.clear()
    settings.HEALTHZ_DETAILS = "public"
    last = MigrationRecorder.Migration.objects.filter(app="jobs").order_by("-id").first()
    last.delete()  # the database now lacks the record of one migration this code has
    try:
        response = client.get("/healthz/ready")
        assert response.status_code == 503
        assert f"jobs.{last.name}" in response.json()["checks"]["migrations"]["error"]
    finally:
        MigrationRecorder.Migration.objects.create(app=last.app, name=last.name)
        health._migrated.clear()
