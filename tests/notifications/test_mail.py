"""E-mail notifications through a real SMTP server: what arrives, retries, refusals, preferences."""

from datetime import timedelta

import pytest
from django.utils import timezone

from drivers.sim import services as sim
from notifications import services as notify
from notifications import tasks
from notifications.models import Notification
from reservations import services
from reservations.models import Reservation

H = timedelta(hours=1)


def reserve_now(user, image, hours=2):
    return services.reserve(user, image, actor=user, duration=hours * H)


def test_a_ready_reservation_mails_its_user(sim_host, image, alice, sync_jobs, smtp_server):
    reservation = reserve_now(alice, image)
    sync_jobs.drain()
    reservation = Reservation.objects.get(pk=reservation.pk)
    assert reservation.status == "ready"
    assert tasks.send_due()["mail"] == 1
    [mail] = smtp_server.wait_for(1)
    assert mail["to"] == ["alice@example.org"]
    assert mail["subject"] == f"Your reservation #{reservation.pk} (debian-12) is ready"
    assert reservation.vm.address in mail["body"] and "alice" in mail["body"]
    assert reservation.get_password() not in mail["body"]  # secrets stay on the page
    row = Notification.objects.get(user=alice, kind="ready")
    assert row.state == "sent" and row.email == "alice@example.org" and row.attempts == 1
    assert tasks.send_due() == {"mail": 0, "webhook": 0}  # nothing sent twice


def test_an_extension_re_announcing_ready_mails_nothing_more(sim_host, image, alice, sync_jobs, smtp_server):
    reservation = reserve_now(alice, image)
    sync_jobs.drain()
    reservation = Reservation.objects.get(pk=reservation.pk)
    services.extend(reservation, reservation.end + H, actor=alice)
    assert Notification.objects.filter(user=alice, kind="ready").count() == 1


def test_a_failed_reservation_mails_the_reason(make_host, image, alice, sync_jobs, smtp_server):
    make_host("sim-1", driver="sim", cpus=8, memory_mib=8192, disk_gib=200)
    make_host("sim-2", driver="sim", cpus=8, memory_mib=8192, disk_gib=200)
    sim.set_fault("sim-1", "start", "fail")
    sim.set_fault("sim-2", "start", "fail")
    reservation = reserve_now(alice, image)
    sync_jobs.drain()
    reservation = Reservation.objects.get(pk=reservation.pk)
    assert reservation.status == "failed"
    tasks.send_due()
    [mail] = smtp_server.wait_for(1)
    assert mail["subject"] == f"Your reservation #{reservation.pk} failed"
    assert "Reason: " in mail["body"] and reservation.error.split(";")[0][:40] in " ".join(mail["body"].split())


def test_an_ended_reservation_mails_once(sim_host, image, alice, sync_jobs, smtp_server):
    reservation = reserve_now(alice, image)
    sync_jobs.drain()
    services.end(Reservation.objects.get(pk=reservation.pk), actor=alice)
    sync_jobs.drain()
    tasks.send_due()
    subjects = [m["subject"] for m in smtp_server.wait_for(2)]
    assert subjects == [
        f"Your reservation #{reservation.pk} (debian-12) is ready",
        f"Your reservation #{reservation.pk} has ended",
    ]


def test_ending_soon_is_mailed_once_per_end_time(sim_host, image, alice, sync_jobs, smtp_server, settings):
    settings.NOTIFY_ENDING_MINUTES = 30
    reservation = reserve_now(alice, image, hours=1)
    sync_jobs.drain()
    assert tasks.queue_ending() == 0  # an hour left: not yet
    assert tasks.queue_ending(now=timezone.now() + timedelta(minutes=40)) == 1
    assert tasks.queue_ending(now=timezone.now() + timedelta(minutes=41)) == 0
    tasks.send_due()
    mails = smtp_server.wait_for(2)
    assert mails[1]["subject"] == f"Your reservation #{reservation.pk} ends in 20 minutes"
    services.extend(Reservation.objects.get(pk=reservation.pk), reservation.end + H, actor=alice)
    assert tasks.queue_ending(now=timezone.now() + timedelta(minutes=100)) == 1  # the new end is told too


def test_a_refusing_smtp_server_is_retried_with_backoff_and_sends_once(
    sim_host, image, alice, sync_jobs, smtp_server, settings
):
    settings.NOTIFY_RETRY_SECONDS = 0.2
    smtp_server.refuse_next = 2
    reservation = reserve_now(alice, image)
    sync_jobs.drain()
    assert Reservation.objects.get(pk=reservation.pk).status == "ready"  # the action itself succeeded
    tasks.send_due()
    row = Notification.objects.get(user=alice, kind="ready")
    assert row.state == "retry" and row.attempts == 1 and "451" in row.last_error
    first_wait = (row.next_attempt - timezone.now()).total_seconds()
    assert 0 < first_wait <= 0.2
    assert tasks.send_due()["mail"] == 0  # not due yet: backoff
    _send_when_due(row)
    row.refresh_from_db()
    assert row.state == "retry" and row.attempts == 2
    assert (row.next_attempt - timezone.now()).total_seconds() > first_wait  # the delay doubled
    _send_when_due(row)
    row.refresh_from_db()
    assert row.state == "sent" and row.attempts == 3 and row.last_error == ""
    tasks.send_due()
    assert len(smtp_server.wait_for(1)) == 1  # exactly one message after the retries


def _send_when_due(row):
    import time

    while Notification.objects.get(pk=row.pk).next_attempt > timezone.now():
        time.sleep(0.05)
    tasks.send_due()


@pytest.mark.parametrize("down", [True, False], ids=["server-down", "server-refuses"])
def test_mail_that_never_goes_through_is_given_up_and_visible_to_admins(
    sim_host, image, alice, admin_user, sync_jobs, smtp_server, settings, api, down
):
    settings.NOTIFY_RETRY_SECONDS, settings.NOTIFY_MAX_ATTEMPTS = 0.05, 2
    if down:
        from tests.processes import free_port

        settings.EMAIL_PORT = free_port()  # nothing listens there
    else:
        smtp_server.refuse_all = True
    reservation = reserve_now(alice, image)
    sync_jobs.drain()
    assert Reservation.objects.get(pk=reservation.pk).status == "ready"
    row = Notification.objects.get(user=alice, kind="ready")
    tasks.send_due()
    _send_when_due(row)
    row.refresh_from_db()
    assert row.state == "failed" and row.attempts == 2 and row.finished is not None
    assert ("Connection refused" in row.last_error) if down else ("550" in row.last_error)
    listed = api(admin_user).get("/api/v1/notifications/", {"state": "failed"}).json()["results"]
    assert [n["id"] for n in listed] == [row.pk] and listed[0]["last_error"] == row.last_error
    assert api(alice).get("/api/v1/notifications/").json()["results"][0]["state"] == "failed"
    assert smtp_server.messages == []


def test_a_kind_turned_off_is_not_mailed(sim_host, image, alice, sync_jobs, smtp_server):
    notify.set_preferences(alice, ["ready"], actor=alice)
    reservation = reserve_now(alice, image)
    sync_jobs.drain()
    tasks.send_due()
    row = Notification.objects.get(user=alice, kind="ready")
    assert row.state == "skipped" and "preferences" in row.last_error
    services.end(Reservation.objects.get(pk=reservation.pk), actor=alice)
    sync_jobs.drain()
    tasks.send_due()
    assert [m["subject"] for m in smtp_server.wait_for(1)] == [f"Your reservation #{reservation.pk} has ended"]


def test_a_user_without_an_address_is_skipped(sim_host, image, django_user_model, sync_jobs, smtp_server):
    carol = django_user_model.objects.create_user("carol", "", "carol-pass-1")
    reserve_now(carol, image)
    sync_jobs.drain()
    tasks.send_due()
    assert Notification.objects.get(user=carol).state == "skipped"


def test_a_rolled_back_change_queues_no_mail(sim_host, image, alice, sync_jobs):
    from django.db import transaction

    reservation = reserve_now(alice, image)
    sync_jobs.drain()
    with pytest.raises(RuntimeError), transaction.atomic():
        services.end(Reservation.objects.get(pk=reservation.pk), actor=alice)
        services.finish(reservation.pk, actor=alice)
        raise RuntimeError("rolled back")
    assert not Notification.objects.filter(kind="ended").exists()


def test_maintenance_mails_moved_and_endangered_reservations(make_host, image, alice, bob, sync_jobs, smtp_server):
    from capacity.snapshot import snapshot
    from inventory import services as inventory

    first = make_host("sim-1", driver="sim", cpus=8, memory_mib=8192, disk_gib=200)
    start = timezone.now() + timedelta(days=1)
    moved = services.reserve(alice, image, actor=alice, start=start, duration=H)
    stuck = services.reserve(bob, image, actor=bob, start=start, duration=H)
    make_host("sim-2", driver="sim", cpus=4, memory_mib=3072, disk_gib=200, memory_ratio=1.0, cpu_ratio=1.0)
    snapshot.expire()
    inventory.set_state(first, "drained", "firmware update", actor="test")
    sync_jobs.drain()
    assert Reservation.objects.get(pk=stuck.pk).degraded
    tasks.send_due()
    kinds = dict(Notification.objects.values_list("user__username", "kind"))
    assert kinds == {"alice": "moved", "bob": "endangered"}
    subjects = {m["to"][0]: m["subject"] for m in smtp_server.wait_for(2)}
    assert subjects == {
        "alice@example.org": f"Your reservation #{moved.pk} was moved to another host",
        "bob@example.org": f"Your reservation #{stuck.pk} is endangered by maintenance",
    }


def test_a_line_break_in_a_name_or_an_address_adds_no_header_nor_recipient(alice, bob, smtp_server):
    # A run's name is the owner's text; an address may come from a directory (LDAP, SAML).
    injected = "nightly\r\nBcc: mallory@example.org\r\nX-Injected: 1"
    notify.queue(
        [
            Notification(
                key="run.1",
                user=alice,
                kind="run_finished",
                event_kind="run.finished",
                data={"id": 1, "name": injected, "status": "success"},
            )
        ]
    )
    type(bob).objects.filter(pk=bob.pk).update(email="bob@example.org\r\nBcc: mallory@example.org")
    notify.queue(
        [
            Notification(
                key="run.2",
                user=bob,
                kind="run_finished",
                event_kind="run.finished",
                data={"id": 2, "name": "plain", "status": "success"},
            )
        ]
    )
    tasks.send_due()
    [mail] = smtp_server.wait_for(1)
    assert mail["to"] == ["alice@example.org"]
    assert mail["subject"] == "Your run nightly Bcc: mallory@example.org X-Injected: 1 finished: success"
    assert mail["message"]["Bcc"] is None and mail["message"]["X-Injected"] is None
    refused = Notification.objects.get(user=bob)
    assert refused.state != "sent" and "Invalid address" in refused.last_error
    assert len(smtp_server.messages) == 1  # nothing went to mallory


def test_a_mail_tells_times_in_its_recipients_zone(sim_host, image, alice, sync_jobs, smtp_server):
    from zoneinfo import ZoneInfo

    from accounts import preferences

    preferences.set_time_zone(alice, "Asia/Kolkata", actor=alice)  # +05:30 all year
    reservation = reserve_now(alice, image)
    sync_jobs.drain()
    tasks.send_due()
    [mail] = smtp_server.wait_for(1)
    end = Reservation.objects.get(pk=reservation.pk).end.astimezone(ZoneInfo("Asia/Kolkata"))
    assert f"It ends at {end:%Y-%m-%d %H:%M} IST." in mail["body"], mail["body"]
