from io import StringIO

from django.core.management import call_command

from provisioning.models import QuotaRule
from reservations.models import BlockAllocation, Reservation


def test_the_whole_demo_runs_twice_and_makes_a_class_block(db, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    out = StringIO()
    call_command("demo", stdout=out)
    call_command("demo", stdout=out)
    assert "class block made" in out.getvalue() and "class block already there" in out.getvalue()
    block = BlockAllocation.objects.get()
    assert Reservation.objects.filter(block=block).count() == 16
    assert QuotaRule.objects.get(name="students").max_duration_minutes == 240
