"""Reservations under the one quota engine: an extension is a new
window counted like a reservation, under the same locks; rules scoped to an image count only
that image; VMs and reservations share the limits; a reverted VM cannot run after its end."""

import threading
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.utils import timezone

from core.errors import Conflict
from provisioning import services as vms
from provisioning.models import VM, QuotaRule
from reservations import services
from reservations.models import Reservation
from tests.images import sim_image

H = timedelta(hours=1)


def fresh(reservation):
    return Reservation.objects.get(pk=reservation.pk)


@pytest.fixture
def later():
    return (timezone.now() + 5 * H).replace(microsecond=0)


@pytest.fixture
def big_host(make_host):
    return make_host("sim-big", cpus=64, memory_mib=262144, disk_gib=4000)


def test_an_extension_is_refused_when_it_would_exceed_the_concurrency_limit(big_host, image, alice, later):
    QuotaRule.objects.create(name="two at a time", max_per_user=2)
    services.reserve(alice, image, actor=alice, start=later + 2 * H, duration=H)
    services.reserve(alice, image, actor=alice, start=later + 2 * H, duration=H)
    early = services.reserve(alice, image, actor=alice, start=later, duration=H)  # overlaps neither
    with pytest.raises(ValidationError) as caught:
        services.extend(early, later + 2.5 * H, actor=alice)  # would make three at once
    assert "you already have 2 reservations or VMs at that time; at most 2 (rule 'two at a time')" in str(caught.value)
    assert fresh(early).end == later + H and fresh(early).allocation.end == later + H
    assert services.extend(fresh(early), later + 1.5 * H, actor=alice).end == later + 1.5 * H  # still alone: fine


def test_an_extension_counts_the_licence_cap_and_group_totals(big_host, image, alice, bob, later):
    vms.update_image(image, actor="test", max_concurrent=1)
    mine = services.reserve(alice, image, actor=alice, start=later, duration=H)
    services.reserve(bob, image, actor=bob, start=later + 2 * H, duration=H)
    with pytest.raises(ValidationError, match=r"debian-12 may run at most 1 at once \(its licence cap\)"):
        services.extend(mine, later + 2.5 * H, actor=alice)


@pytest.mark.file_db
def test_parallel_extend_and_reserve_are_counted_one_after_the_other(transactional_db, make_host, image, alice, later):
    make_host("sim-big", cpus=64, memory_mib=262144, disk_gib=4000)
    QuotaRule.objects.create(name="two at a time", max_per_user=2)
    services.reserve(alice, image, actor=alice, start=later + 2 * H, duration=H)
    early = services.reserve(alice, image, actor=alice, start=later, duration=H)
    # Each alone fits (one other overlaps it); both together would make three at once.
    outcomes, gate = [], threading.Barrier(2)

    def run(work):
        gate.wait()
        try:
            work()
            outcomes.append("ok")
        except ValidationError as exc:
            outcomes.append(str(exc))
        finally:
            connection.close()

    threads = [
        threading.Thread(target=run, args=(lambda: services.extend(fresh(early), later + 2.5 * H, actor=alice),)),
        threading.Thread(
            target=run,
            args=(lambda: services.reserve(alice, image, actor=alice, start=later + 1.5 * H, end=later + 2.5 * H),),
        ),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(outcomes) == 2 and outcomes.count("ok") == 1, outcomes
    assert "rule 'two at a time'" in next(o for o in outcomes if o != "ok")


@pytest.mark.file_db
def test_parallel_reservations_for_now_are_counted_and_claimed_one_after_the_other(
    transactional_db, make_host, image, alice, bob
):
    """Starting now: quota, claim and build job in one transaction (on SQLite with no savepoint
    of the claim's own). Three requests at once for a host with room for two, one user's two of
    them past their limit: that user's second is refused by the rule, the others fit."""
    host = make_host("sim-small", cpus=4, memory_mib=4096, disk_gib=40)  # two default VMs
    QuotaRule.objects.create(name="one at a time", max_per_user=1)
    outcomes, gate = [], threading.Barrier(3)

    def run(user):
        gate.wait()
        try:
            services.reserve(user, image, actor=user, duration=H)
            outcomes.append((user.username, "ok"))
        except ValidationError as exc:
            outcomes.append((user.username, str(exc)))
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(user,)) for user in (alice, alice, bob)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(who for who, outcome in outcomes if outcome == "ok") == ["alice", "bob"], outcomes
    refused = [(who, outcome) for who, outcome in outcomes if outcome != "ok"]
    assert len(refused) == 1 and refused[0][0] == "alice" and "rule 'one at a time'" in refused[0][1], outcomes
    assert sorted(Reservation.objects.values_list("user__username", flat=True)) == ["alice", "bob"]
    assert VM.objects.count() == 2 and all(r.allocation.host == host for r in Reservation.objects.all())


def test_an_image_rule_counts_only_that_images_reservations(big_host, image, alice, later):
    other = sim_image(
        "windows-11",
        location="sim://w11",
        size_gib=1,
        os="Windows 11",
        min_memory_mib=256,
        default_memory_mib=1024,
        default_disk_gib=10,
    )
    QuotaRule.objects.create(name="one windows", image=other, max_per_user=1)
    services.reserve(alice, image, actor=alice, start=later, duration=H)
    services.reserve(alice, other, actor=alice, start=later, duration=H)  # the debian one is not windows-11's
    with pytest.raises(ValidationError, match=r"of windows-11 at that time; at most 1 \(rule 'one windows'\)"):
        services.reserve(alice, other, actor=alice, start=later, duration=H)


def test_vms_and_reservations_share_the_limit(big_host, image, alice):
    vms.request_vm(actor=alice, owner=alice, image=image)
    vms.request_vm(actor=alice, owner=alice, image=image)
    services.reserve(alice, image, actor=alice, duration=H)
    with pytest.raises(ValidationError, match=r"you already have 3 reservations or VMs .* \(the site default\)"):
        services.reserve(alice, image, actor=alice, duration=H)
    with pytest.raises(ValidationError, match=r"you already have 3 reservations or VMs .* \(the site default\)"):
        vms.request_vm(actor=alice, owner=alice, image=image)
    assert VM.objects.filter(owner=alice, adhoc=False).count() == 1  # the reservation's VM counts as the reservation


def test_a_vm_reverted_at_its_reservations_end_cannot_be_started(sim_host, image, alice, sync_jobs):
    vms.update_image(image, actor="test", revert_on_end=True)
    reservation = services.reserve(alice, image, actor=alice, duration=H)
    sync_jobs.drain()
    services.end(fresh(reservation), actor=alice)
    sync_jobs.drain()
    vm = VM.objects.select_related("allocation").get(pk=fresh(reservation).vm_id)
    assert vm.state == "stopped" and vm.allocation.vcpus == 0  # only its disk is claimed: it is parked
    with pytest.raises(Conflict, match="is parked for its next user"):
        vms.submit_action(vm, "start", actor=alice)
