"""Real servers for the notification tests: an SMTP server (aiosmtpd) and an HTTP server
receiving webhooks, both in this process on 127.0.0.1, stopped after each test."""

import hashlib
import hmac
import http.server
import json
import socket
import threading
import time
from email import message_from_bytes, policy

import pytest
from aiosmtpd.controller import Controller

from tests.listeners import Handler
from tests.processes import free_port
from tests.reservations.conftest import image, sync_jobs  # noqa: F401 (fixtures)


@pytest.fixture(autouse=True)
def _fresh_webhook_cache():
    from notifications.services import forget_hooks

    forget_hooks()
    yield
    forget_hooks()


class Mailbox:
    """aiosmtpd handler: keeps each message; ``refuse`` n messages first (451) or all (550)."""

    def __init__(self):
        self.messages = []
        self.refuse_next = 0
        self.refuse_all = False
        self.lock = threading.Lock()

    async def handle_DATA(self, server, session, envelope):
        with self.lock:
            if self.refuse_all:
                return "550 mailbox unavailable (test)"
            if self.refuse_next:
                self.refuse_next -= 1
                return "451 try again later (test)"
            message = message_from_bytes(envelope.content, policy=policy.default)
            self.messages.append(
                {
                    "to": list(envelope.rcpt_tos),
                    "from": envelope.mail_from,
                    "message": message,
                    "subject": str(message["Subject"]),
                    "body": message.get_content(),
                }
            )
        return "250 OK"

    def wait_for(self, count, timeout=10):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.messages) >= count:
                return self.messages
            time.sleep(0.05)
        raise AssertionError(f"{len(self.messages)} of {count} mails arrived in {timeout}s")


@pytest.fixture
def smtp_server(settings):
    """A real SMTP server on a free loopback port, and Django's SMTP backend pointed at it."""
    mailbox = Mailbox()
    port = free_port()
    controller = Controller(mailbox, hostname="127.0.0.1", port=port)
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
    settings.EMAIL_TIMEOUT = 5
    mailbox.port = port
    yield mailbox
    controller.stop()


TOLERANCE_SECONDS = 300


def verify(secret, headers, body, now=None):
    """A receiver's check, as docs/user/notifications.md tells it: the HMAC of ``timestamp + "." + body``, and a
    timestamp within five minutes (a captured delivery replayed later is refused)."""
    timestamp = headers.get("X-Vclmgr-Timestamp", "")
    if not timestamp.isdigit() or abs((now or time.time()) - int(timestamp)) > TOLERANCE_SECONDS:
        return False
    signed = timestamp.encode() + b"." + body
    expected = "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return hmac.compare_digest(headers.get("X-Vclmgr-Signature", ""), expected)


class Receiver(Handler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        server = self.server
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if server.delay:
            time.sleep(server.delay)
        signed = verify(server.secret, self.headers, body)
        status = server.status if signed else 401
        server.received.append(
            {"body": json.loads(body), "raw": body, "headers": dict(self.headers), "signed": signed, "status": status}
        )
        self.answer(status, headers={"Location": server.location})


@pytest.fixture
def webhook_server(settings):
    """An HTTP server on 127.0.0.1 that checks each webhook's signature; ``.status``/``.delay``/``.location``
    (a redirect's target, with a 3xx status) to misbehave.
    127.0.0.1 is allow-listed for the test (refused by default: it is no public address)."""
    settings.VCLMGR_OUTBOUND_ALLOW = ["127.0.0.1"]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    server.daemon_threads = True
    server.received, server.status, server.delay, server.secret = [], 200, 0, "s3cret-signing-key-1234"
    server.location = None
    server.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


class SilentServer:
    """A TCP listener on 127.0.0.1 that takes requests and never answers them (``trickle``: it
    sends a status line one byte at a time, ``interval`` apart, and never ends the headers)."""

    def __init__(self, trickle=False, interval=0.2):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/hook"
        self.trickle, self.interval = trickle, interval
        self.stopping = threading.Event()
        self.requests = 0
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self):
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.requests += 1
            thread = threading.Thread(target=self._hold, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _hold(self, conn):
        with conn:
            line = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"x" * 200
            sent = 0
            while not self.stopping.wait(self.interval):
                if self.trickle and sent < len(line):
                    try:
                        conn.sendall(line[sent : sent + 1])
                    except OSError:
                        return
                    sent += 1

    def stop(self):
        self.stopping.set()
        self.listener.close()
        for thread in self.threads:
            thread.join(5)


@pytest.fixture
def silent_server(settings):
    """``silent_server(trickle=False)``: servers that hold each request unanswered; all stopped after."""
    settings.VCLMGR_OUTBOUND_ALLOW = ["127.0.0.1"]
    servers = []

    def start(**options):
        servers.append(SilentServer(**options))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()
