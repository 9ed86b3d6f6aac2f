"""A claim still held after its end keeps its room until it is released: its VM is not known to
be gone (``live_allocations`` once stopped counting it while the VM ran on)."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from capacity import loaders
from capacity import services as capacity
from capacity.models import Allocation
from tests.conftest import TEST

pytestmark = pytest.mark.django_db


def whole_host(hours=1):
    now = timezone.now()
    return capacity.Demand(vcpus=2, memory_mib=4096, disk_gib=20, start=now, end=now + timedelta(hours=hours))


def hold(host, end):
    return Allocation.objects.create(
        host=host,
        purpose="vm 1",
        vcpus=2,
        memory_mib=4096,
        disk_gib=20,
        start=timezone.now() - timedelta(hours=2),
        end=end,
    )


def test_an_overdue_claim_holds_its_room_in_a_fresh_snapshot_and_the_locked_recheck(make_host):
    host = make_host("only", cpus=2, cpu_ratio=1.0, memory_mib=4096)
    held = hold(host, timezone.now() - timedelta(minutes=5))
    assert not capacity.plan(whole_host()).ok
    assert not capacity._host_check(host.pk, whole_host().request()).ok
    with pytest.raises(capacity.NoCapacity):
        capacity.claim(whole_host(), actor=TEST)
    capacity.release(held, actor=TEST)
    assert capacity.claim(whole_host(), actor=TEST).host == host


def test_a_claim_whose_end_passes_while_the_snapshot_lives_keeps_its_room(make_host):
    host = make_host("only", cpus=2, cpu_ratio=1.0, memory_mib=4096)
    hold(host, timezone.now() + timedelta(seconds=1))
    assert not capacity.plan(whole_host()).ok  # the snapshot is loaded with the claim's end
    time.sleep(1.2)
    assert not capacity.plan(whole_host()).ok  # caught up: over its end, still held
    assert not capacity.plan(whole_host()).ok  # and again (it is not added twice)
    Allocation.objects.filter(host=host).update(released=timezone.now())
    assert capacity.plan(whole_host()).ok


def test_the_core_sees_an_overdue_claim_as_open_ended(make_host):
    host = make_host("only")
    now = timezone.now()
    row = next(iter(loaders.live_allocations(now, [hold(host, now - timedelta(seconds=1)).host_id])))
    assert loaders.allocation_from_row(row, now).end is None
    assert loaders.allocation_from_row(row).end is not None  # without a clock: as stored


def test_a_host_holding_an_overdue_claim_cannot_be_deleted(make_host):
    from inventory import services as inventory

    host = make_host("busy")
    held = hold(host, timezone.now() - timedelta(minutes=1))
    with pytest.raises(inventory.InUse, match="1 live allocation"):
        inventory.delete_hypervisor(host, actor=TEST)
    capacity.release(held, actor=TEST)
    inventory.delete_hypervisor(host, actor=TEST)
