from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from reservations.models import Reservation


def run(*args):
    out = StringIO()
    call_command("reservation", *args, stdout=out)
    return out.getvalue()


def test_create_list_info_extend_cancel(sim_host, image, alice):
    start = (timezone.now() + timedelta(hours=3)).replace(microsecond=0)
    out = run("create", "debian-12", "--user", "alice", "--start", start.isoformat(), "--duration", "60")
    reservation = Reservation.objects.get()
    assert out.strip() == f"reservation {reservation.pk}: pending"
    assert "alice" in run("list") and "pending" in run("info", str(reservation.pk))
    new_end = start + timedelta(hours=2)
    assert "now ends" in run("extend", str(reservation.pk), "--end", new_end.isoformat())
    assert Reservation.objects.get().end == new_end
    assert "canceled" in run("cancel", str(reservation.pk))
    assert Reservation.objects.get().status == "canceled"


def test_refusals_are_clear(sim_host, image, alice):
    with pytest.raises(CommandError, match="refused: end: at most 8 h"):
        run("create", "debian-12", "--user", "alice", "--duration", str(60 * 24))
    with pytest.raises(CommandError, match="image 'nope' does not exist"):
        run("create", "nope", "--user", "alice", "--duration", "30")
    with pytest.raises(CommandError, match="not a date and time"):
        run("create", "debian-12", "--user", "alice", "--start", "tomorrow", "--duration", "30")
    with pytest.raises(CommandError, match="--ssh-key /nonexistent.pub: No such file or directory"):
        run("create", "debian-12", "--user", "alice", "--duration", "30", "--ssh-key", "/nonexistent.pub")
    with pytest.raises(CommandError, match="reservation 42 does not exist"):
        run("end", "42")
    assert not Reservation.objects.exists()


def test_check_says_whether_it_fits(sim_host, image):
    assert run("check", "debian-12", "--duration", "60").strip().startswith("fits")
