"""Real worker processes send the mail and the webhook after the commit of the change."""

import json

import pytest

from notifications import services as notify
from notifications.models import Notification, WebhookDelivery
from reservations import services
from reservations.models import Reservation
from tests import processes
from tests.reservations.test_services import H

pytestmark = pytest.mark.slow


def test_workers_mail_and_post_a_ready_reservation(
    transactional_db, sim_host, image, alice, tmp_path, smtp_server, webhook_server
):
    notify.create_webhook(
        actor="test",
        name="ci",
        url=webhook_server.url,
        event_kinds=["reservation.changed"],
        secret=webhook_server.secret,
    )
    worker = processes.start_worker(
        tmp_path,
        workers=2,
        EMAIL_BACKEND="smtp",
        EMAIL_HOST="127.0.0.1",
        EMAIL_PORT=smtp_server.port,
        NOTIFY_POLL_SECONDS=0.5,
        PROMETHEUS_MULTIPROC_DIR=tmp_path,
    )
    try:
        reservation = services.reserve(alice, image, actor=alice, duration=2 * H)
        processes.wait_for(lambda: Reservation.objects.get(pk=reservation.pk).status == "ready", 60, "ready", worker)
        [mail] = smtp_server.wait_for(1, timeout=30)
        assert mail["to"] == ["alice@example.org"] and mail["subject"].endswith("is ready")
        processes.wait_for(lambda: WebhookDelivery.objects.filter(state="sent").count() == 3, 30, "webhooks", worker)
        # The mail is in the box before the worker marks it sent: stopping the worker in
        # between would leave it "sending" until its lease ends.
        processes.wait_for(
            lambda: Notification.objects.get(user=alice, kind="ready").state == "sent", 30, "mail marked sent", worker
        )
    finally:
        worker.stop()
    assert [json.dumps(hit["body"]["data"]["status"]) for hit in webhook_server.received].count('"ready"') == 1
    assert all(hit["signed"] for hit in webhook_server.received)
    assert len(smtp_server.messages) == 1  # two worker processes, one mail
