"""The outbound-request policy: what it refuses before any connection, and what it does when it
connects (one lookup, the checked address, no redirect, no other origin). The only listeners are
the test's own, on 127.0.0.1, allow-listed where a test reaches them; every other address is
refused before a socket connects (``connects``, in tests/conftest.py, records each attempt and
lets none through but to 127.0.0.1)."""

import socket
import threading
import time

import pytest

from core import outbound
from tests.listeners import Handler, Listeners

REFUSED = [
    "http://169.254.169.254/latest/meta-data/",  # the cloud metadata address (link-local)
    "http://[fe80::1]/",
    "http://10.0.0.1/hook",
    "http://172.16.5.4/",
    "http://192.168.1.1:8080/",
    "http://100.64.0.1/",  # shared address space
    "http://127.0.0.1:9/",
    "http://[::1]/",
    "http://0.0.0.0/",
    "http://224.0.0.1/",  # multicast
    "http://240.0.0.1/",  # reserved
    "http://localhost/",
    "http://LOCALHOST./",
    "http://metadata/computeMetadata/v1/",  # a one-label name: the local network's
    "http://metadata.google.internal/",
    "http://printer.local/",
    "http://2130706433/",  # 127.0.0.1 in decimal
    "http://0177.0.0.1/",  # in octal
    "http://0x7f.0.0.1/",  # in hex
    "http://0x7f000001/",
    "http://127.1/",
    "http://[::ffff:127.0.0.1]/",  # IPv4-mapped IPv6
    "http://[::ffff:a9fe:a9fe]/",  # 169.254.169.254, mapped
    "http://[2002:7f00:1::]/",  # 6to4 around 127.0.0.1
    "http://[64:ff9b::a00:1]/",  # NAT64 around 10.0.0.1
    "ftp://8.8.8.8/",
    "file:///etc/passwd",
]


@pytest.fixture
def fake_dns(monkeypatch):
    """``fake_dns({"hook.example.org": ["127.0.0.1", "10.0.0.1"]})``: each lookup of a name gets
    the next answer (the last one again after that), as a rebinding DNS server would answer; an
    answer may be a tuple of addresses. Every lookup is recorded. Other names resolve as usual
    (IP literals only, here)."""
    lookups = []
    real = socket.getaddrinfo

    def install(answers):
        def getaddrinfo(host, port, *args, **kwargs):
            lookups.append(host)
            if host in answers:
                answer = answers[host][min(lookups.count(host), len(answers[host])) - 1]
                addresses = answer if isinstance(answer, tuple) else (answer,)
                return [info for address in addresses for info in real(address, port, *args, **kwargs)]
            return real(host, port, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
        return lookups

    return install


class _Handler(Handler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.hits.append({"host": self.headers["Host"], "path": self.path})
        self.answer(self.server.status, headers={"Location": self.server.location})


@pytest.fixture
def listener():
    """``listener(status=200, location=None)``: HTTP servers on 127.0.0.1, all stopped after."""
    listeners = Listeners()
    yield lambda status=200, location=None: listeners.start(_Handler, hits=[], status=status, location=location)
    listeners.stop()


def post(url):
    return outbound.post(url, b"{}", {"Content-Type": "application/json"}, timeout=2)


@pytest.mark.parametrize("url", REFUSED)
def test_it_refuses_internal_targets_before_any_connection(url, connects, settings):
    settings.VCLMGR_OUTBOUND_ALLOW = []  # the production default
    with pytest.raises(outbound.Refused) as caught:
        post(url)
    assert caught.value.public == "delivery failed"
    assert connects == []


def test_a_name_resolving_to_a_loopback_address_is_refused(connects, fake_dns, settings):
    settings.VCLMGR_OUTBOUND_ALLOW = []
    fake_dns({"hook.example.org": ["127.0.0.1"]})
    with pytest.raises(outbound.Refused, match="resolves to 127.0.0.1"):
        post("http://hook.example.org/hook")
    # One private address among public ones is enough to refuse: the client might pick it.
    fake_dns({"mixed.example.org": [("8.8.8.8", "10.0.0.1")]})
    with pytest.raises(outbound.Refused):
        outbound.check_host("mixed.example.org")
    assert connects == []


def test_the_allow_list_opens_networks_and_names(connects, fake_dns, listener, settings):
    server = listener()
    settings.VCLMGR_OUTBOUND_ALLOW = []
    with pytest.raises(outbound.Refused):
        post(f"http://127.0.0.1:{server.port}/hook")
    settings.VCLMGR_OUTBOUND_ALLOW = ["127.0.0.0/8"]
    assert post(f"http://127.0.0.1:{server.port}/hook") == 200
    settings.VCLMGR_OUTBOUND_ALLOW = ["bmc.lab.example.org"]
    fake_dns({"bmc.lab.example.org": ["127.0.0.1"]})
    assert post(f"http://bmc.lab.example.org:{server.port}/hook") == 200
    assert [hit["host"] for hit in server.hits] == [f"127.0.0.1:{server.port}", f"bmc.lab.example.org:{server.port}"]
    assert connects == ["127.0.0.1", "127.0.0.1"]


def test_the_checked_address_is_the_one_connected_to(connects, fake_dns, listener, settings):
    # A rebinding DNS server: 127.0.0.1 (allowed) first, then 10.0.0.1. A client that looked the
    # name up again to connect would reach the second; the policy looks it up once.
    settings.VCLMGR_OUTBOUND_ALLOW = ["127.0.0.1"]
    server = listener()
    lookups = fake_dns({"hook.example.org": ["127.0.0.1", "10.0.0.1"]})
    assert post(f"http://hook.example.org:{server.port}/hook") == 200
    assert lookups.count("hook.example.org") == 1 and connects == ["127.0.0.1"]
    assert server.hits == [{"host": f"hook.example.org:{server.port}", "path": "/hook"}]  # the name kept in Host


def test_a_redirect_is_not_followed(connects, listener, settings):
    settings.VCLMGR_OUTBOUND_ALLOW = ["127.0.0.1"]
    elsewhere = listener()
    redirecting = listener(status=307, location=f"http://127.0.0.1:{elsewhere.port}/internal")
    assert post(f"http://127.0.0.1:{redirecting.port}/hook") == 307
    assert len(redirecting.hits) == 1 and elsewhere.hits == []


def test_a_session_sends_to_its_own_origin_only(connects, listener, settings):
    # A server's answer may name another URL (a redirect, a Redfish link): the session refuses it.
    settings.VCLMGR_OUTBOUND_ALLOW = ["127.0.0.1"]
    own, other = listener(), listener()
    target = outbound.check(f"http://127.0.0.1:{own.port}/")
    with outbound.session(target, connect=2, total=2) as pinned:
        assert pinned.post(f"http://127.0.0.1:{own.port}/a", data=b"").status_code == 200
        for url in (f"http://127.0.0.1:{other.port}/b", f"https://127.0.0.1:{own.port}/c", "http://10.0.0.1/"):
            with pytest.raises(outbound.Refused):
                pinned.post(url, data=b"")
    assert len(own.hits) == 1 and other.hits == [] and connects == ["127.0.0.1"]


def test_a_silent_server_is_cut_off_at_the_deadline(connects, settings):
    settings.VCLMGR_OUTBOUND_ALLOW = ["127.0.0.1"]
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (the backlog) and never answers
    try:
        with pytest.raises(outbound.Failed, match="timed out after 0.3 s"):
            outbound.post(f"http://127.0.0.1:{silent.getsockname()[1]}/", b"", {}, timeout=0.3)
    finally:
        silent.close()


def test_the_form_check_refuses_addresses_without_a_lookup(fake_dns, settings):
    settings.VCLMGR_OUTBOUND_ALLOW = ["10.20.0.0/16"]
    lookups = fake_dns({})
    assert outbound.refusal("http://10.0.0.1/") and outbound.refusal("http://localhost:8000/")
    assert outbound.refusal("http://[::ffff:169.254.169.254]/")
    assert outbound.refusal("http://10.20.3.4/") is None and outbound.refusal("https://hooks.example.org/x") is None
    assert lookups == []


def test_a_lookup_that_hangs_ends_within_the_time_limit(connects, monkeypatch, settings):
    settings.VCLMGR_OUTBOUND_ALLOW = []
    release = threading.Event()
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: release.wait(5) and [])  # a silent resolver
    began = time.monotonic()
    try:
        with pytest.raises(outbound.Failed, match="timed out after 0.3 s"):
            outbound.post("http://hooks.example.org/hook", b"", {}, timeout=0.3)
    finally:
        release.set()
    assert time.monotonic() - began < 1 and connects == []
