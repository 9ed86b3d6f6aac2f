"""Through a real server (daphne): a malformed or oversized body gets the API's JSON error."""

import http.client

import pytest

from accounts import tokens

pytestmark = pytest.mark.slow

CASES = [
    ("multipart/form-data; boundary=xx", b'--xx\r\nContent-Disposition: form-data; name="a"\r\n\r\nunterminated'),
    ("multipart/form-data", b"no boundary at all"),
    ("multipart/form-data; boundary=xx", b"--xx\r\n" + b"X" * 100_000 + b"\r\n\r\n--xx--"),
    (
        "multipart/form-data; boundary=xx",
        b"".join(b'--xx\r\nContent-Disposition: form-data; name="f%d"\r\n\r\nv\r\n' % i for i in range(1200))
        + b"--xx--",
    ),
    ("application/x-www-form-urlencoded", b"&".join(b"f%d=1" % i for i in range(1200))),
    ("application/json", b"[" * 50_000 + b"]" * 50_000),
]


def test_malformed_bodies_get_a_json_4xx_from_the_server(asgi_server, alice):
    token = tokens.issue(alice, "t", scopes="all")[1]
    for content_type, body in CASES:
        connection = http.client.HTTPConnection("127.0.0.1", asgi_server.port, timeout=20)
        connection.request(
            "POST", "/api/v1/reservations/", body, {"Content-Type": content_type, "Authorization": f"Bearer {token}"}
        )
        response = connection.getresponse()
        payload = response.read()
        connection.close()
        assert 400 <= response.status < 500, (content_type, response.status, payload[:200])
        assert response.getheader("Content-Type", "").startswith("application/json"), (content_type, payload[:200])
