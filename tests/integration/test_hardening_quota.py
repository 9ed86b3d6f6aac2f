"""The quota holds under a burst: one user's parallel requests through real HTTP, over several
server processes, get exactly the limit and the rest are refused naming the rule,
for reservations and ad-hoc VMs alike (9)."""

import json
import threading
import urllib.error
import urllib.request
from datetime import timedelta

import pytest
from django.utils import timezone

from accounts import tokens
from provisioning.models import VM, QuotaRule
from reservations.models import Reservation
from tests import processes
from tests.images import small_image

pytestmark = pytest.mark.slow

BURST = 12
LIMIT = 2  # below the site default (3), so the refusal names the rule
SERVERS = 3


@pytest.fixture
def servers(transactional_db, tmp_path):
    started = []
    try:
        for n in range(SERVERS):
            folder = tmp_path / f"web{n}"
            folder.mkdir()
            started.append(processes.start_asgi(folder))
        yield started
    finally:
        for child in started:
            child.stop()


def _post(url, token, body):
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 (loopback)
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def burst(urls, token, body, count, path="/api/v1/reservations/"):
    """``count`` requests released at once, spread over the servers; [(status, body)]."""
    answers = [None] * count
    gate = threading.Barrier(count)

    def send(i):
        gate.wait()
        answers[i] = _post(f"{urls[i % len(urls)]}{path}", token, body)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return answers


def assert_exactly_the_quota(answers, accepted):
    statuses = sorted(status for status, _ in answers)
    assert statuses.count(accepted) == LIMIT, answers
    assert statuses.count(400) == BURST - LIMIT, answers
    for status, answer in answers:
        if status == 400:
            assert "rule 'two at a time'" in json.dumps(answer), answer


def _image(make_host):
    make_host("burst-1", cpus=64, memory_mib=262144, disk_gib=2000)
    image = small_image("deb", "sim://deb")
    QuotaRule.objects.create(name="two at a time", max_per_user=LIMIT)
    return image


def test_a_burst_of_one_users_vm_requests_gets_exactly_the_quota(servers, make_host, alice):
    image = _image(make_host)
    _, token = tokens.issue(alice, "burst", scopes="all")

    answers = burst([server.url for server in servers], token, {"image": image.pk}, BURST, path="/api/v1/vms/")

    assert_exactly_the_quota(answers, 202)
    assert VM.objects.filter(owner=alice).count() == LIMIT
    assert not VM.objects.filter(owner=alice, end__isnull=True).exists()


def test_a_burst_of_one_users_requests_gets_exactly_the_quota(servers, make_host, alice):
    image = _image(make_host)
    _, token = tokens.issue(alice, "burst", scopes="all")
    start = (timezone.now() + timedelta(hours=5)).replace(microsecond=0)
    body = {"image": image.pk, "start": start.isoformat(), "end": (start + timedelta(hours=1)).isoformat()}

    answers = burst([server.url for server in servers], token, body, BURST)

    assert_exactly_the_quota(answers, 201)
    assert Reservation.objects.filter(user=alice).count() == LIMIT
