"""A request whose PostgreSQL session is dropped inside its transaction runs once more, if
nothing of it had committed; else the error stands (500). Through Django's test client and the
whole middleware stack, on the PostgreSQL leg's own database (marker ``postgres``: the SQLite
leg deselects it)."""

import pytest
from django.db import connection, transaction
from django.http import JsonResponse
from django.urls import path

from core.models import Event
from tests.lost_session import terminate

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
CALLS = []


def terminate_own_session():
    """The session of this request's connection, ended from another (``pg_terminate_backend``)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        terminate(cursor.fetchone()[0])


def dropped_in_transaction(request):
    CALLS.append(request.body)
    with transaction.atomic():
        Event.objects.create(topic="test", kind="test", data={"call": len(CALLS)})
        if len(CALLS) == 1:
            terminate_own_session()
            Event.objects.count()  # the session is gone: OperationalError
    return JsonResponse({"calls": len(CALLS), "body": request.body.decode()})


def committed_then_dropped(request):
    CALLS.append(request.body)
    Event.objects.create(topic="test", kind="test", data={"call": len(CALLS)})  # committed (autocommit)
    with transaction.atomic():
        terminate_own_session()
        Event.objects.count()
    return JsonResponse({"calls": len(CALLS)})


urlpatterns = [path("api/t/dropped", dropped_in_transaction), path("api/t/committed", committed_then_dropped)]


@pytest.fixture(autouse=True)
def _urls(settings):
    assert connection.vendor == "postgresql", "the postgres marker's tests run on the PostgreSQL leg"
    settings.ROOT_URLCONF = __name__
    CALLS.clear()


def test_a_transaction_lost_with_its_session_is_run_again(client, admin_user):
    client.force_login(admin_user)
    answer = client.post("/api/t/dropped", data=b'{"x": 1}', content_type="application/json")
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"calls": 2, "body": '{"x": 1}'}  # the body read again on the second run
    assert list(Event.objects.filter(topic="test").values_list("data", flat=True)) == [{"call": 2}]


def test_after_a_commit_the_error_stands(client, admin_user):
    client.force_login(admin_user)
    client.raise_request_exception = False
    answer = client.post("/api/t/committed", data=b"{}", content_type="application/json")
    assert answer.status_code == 500
    assert len(CALLS) == 1  # not run twice: its first write had committed
    assert Event.objects.filter(topic="test").count() == 1
