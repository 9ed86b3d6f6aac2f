"""The chassis page's live feed over a real websocket (daphne in its own process): a state
change, an import and a move each reach the subscribed administrator with the slots to redraw."""

import pytest

from inventory import services
from tests.inventory.conftest import TEST, host_row, import_csv

pytestmark = pytest.mark.slow


def test_chassis_slots_update_live(admin_user, alice, session_cookie, ws_connect):
    chassis = services.create_blade_center(actor=TEST, name="bc1", slot_count=16)
    host = services.create_hypervisor(
        actor=TEST,
        name="bc1-s03",
        address="10.0.0.3",
        cpus=8,
        memory_mib=4096,
        disk_gib=100,
        blade_center=chassis,
        slot=3,
    )
    topic = f"bladecenter.{chassis.pk}"

    outsider = ws_connect(cookie=session_cookie(alice))
    assert outsider.subscribe([topic, f"hypervisor.{host.pk}"])["denied"] == [topic, f"hypervisor.{host.pk}"]

    ws = ws_connect(cookie=session_cookie(admin_user))
    assert ws.subscribe([topic])["topics"] == [topic]

    services.set_state(host, "drained", "firmware", actor=TEST)
    event = ws.receive_until(lambda m: m["type"] == "event", timeout=10)
    assert event["kind"] == "hypervisor.state"
    assert event["data"]["slots"] == [{"slot": 3, "id": host.pk, "name": "bc1-s03", "state": "drained"}]

    report = import_csv([host_row(1, name="bc1-s05", blade_center="bc1", slot=5)])
    assert report.committed
    event = ws.receive_until(lambda m: m["type"] == "event" and m["kind"] == "bladecenter.slots", timeout=10)
    assert [(s["slot"], s["name"], s["state"]) for s in event["data"]["slots"]] == [(5, "bc1-s05", "online")]

    services.update_hypervisor(host, actor=TEST, slot=4)
    event = ws.receive_until(lambda m: m["type"] == "event" and m["kind"] == "hypervisor.changed", timeout=10)
    assert {(s["slot"], s["id"]) for s in event["data"]["slots"]} == {(4, host.pk), (3, None)}
