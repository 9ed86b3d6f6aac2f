"""One real SMTP server (aiosmtpd, on a loopback port) shared by a test module: ``smtp_module``
starts it once and stops it after the module; ``mail`` points Django's SMTP backend at it and
empties its mailbox for each test; ``delivered`` sends what is queued and reads what arrived.
Import the fixtures into a module to use them (the per-test server is ``tests.notifications``'s
``smtp_server``)."""

import pytest
from aiosmtpd.controller import Controller

from tests.processes import free_port


@pytest.fixture(scope="module")
def smtp_module():
    from tests.notifications.conftest import Mailbox  # (that conftest imports the reservations' one)

    mailbox = Mailbox()
    port = free_port()
    controller = Controller(mailbox, hostname="127.0.0.1", port=port)
    controller.start()
    mailbox.port = port
    try:
        yield mailbox
    finally:
        controller.stop()


@pytest.fixture
def mail(smtp_module, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", smtp_module.port, 5
    with smtp_module.lock:
        smtp_module.messages.clear()
    return smtp_module


def delivered(mailbox, count):
    """Send what is queued and wait for ``count`` mails (exactly); returns
    ``{recipient: [(subject, body with its white space folded)]}``."""
    from notifications import tasks

    tasks.send_due()
    found = {}
    for message in mailbox.wait_for(count):
        for to in message["to"]:
            found.setdefault(to, []).append((message["subject"], " ".join(message["body"].split())))
    assert len(mailbox.messages) == count
    return found
