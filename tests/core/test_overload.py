"""A database with no connection to spare answers 503 with Retry-After, never 500.

The pool timeout comes from a real psycopg pool of one connection on the machine's PostgreSQL
(both legs have it), held busy while a second caller waits.
"""

import pytest
from django.db import OperationalError
from django.http import HttpResponse
from django.test import RequestFactory
from psycopg_pool import ConnectionPool

from core.api.errors import ApiJsonErrorsMiddleware, is_overload

PG = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture(scope="module")
def pool_timeout():
    """A real PoolTimeout, as Django's pooled backend sees it (wrapped in OperationalError)."""
    with ConnectionPool(PG, min_size=1, max_size=1, open=True, timeout=5) as pool:
        with pool.connection():
            with pytest.raises(Exception) as caught:
                pool.getconn(timeout=0.1)
    try:
        raise OperationalError(str(caught.value)) from caught.value
    except OperationalError as wrapped:
        return wrapped


def answer(path, exc):
    middleware = ApiJsonErrorsMiddleware(lambda request: HttpResponse("ok"))
    return middleware.process_exception(RequestFactory().get(path), exc)


def test_an_exhausted_pool_is_an_overload(pool_timeout):
    assert type(pool_timeout.__cause__).__name__ == "PoolTimeout"
    assert is_overload(pool_timeout)


@pytest.mark.parametrize("path", ["/api/v1/reservations/", "/reservations/"])
def test_it_answers_an_overload_with_503_and_retry_after(pool_timeout, path):
    response = answer(path, pool_timeout)
    assert response.status_code == 503 and response["Retry-After"] == "2"
    assert b"busy" in response.content


def test_a_full_server_is_an_overload_too():
    class TooManyClients(Exception):
        sqlstate = "53300"

    try:
        raise OperationalError("sorry, too many clients already") from TooManyClients()
    except OperationalError as exc:
        assert is_overload(exc)


def test_other_database_errors_stay_errors():
    class SyntaxProblem(Exception):
        sqlstate = "42601"

    try:
        raise OperationalError("syntax") from SyntaxProblem()
    except OperationalError as exc:
        assert not is_overload(exc)
        assert answer("/api/v1/reservations/", exc).status_code == 500
        assert answer("/reservations/", exc) is None  # not ours to answer: Django's 500 page
