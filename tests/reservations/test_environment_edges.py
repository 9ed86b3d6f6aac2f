"""Environments at their edges, on the simulator: quotas and licence caps counted once
for all machines, networks forgotten however an environment ends before it is built, removed
whichever machine goes last, machines never moved apart, and its user told once."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.utils import timezone

from drivers.sim.models import SimNetwork, SimVM
from environments import services as templates
from jobs import services as jobs
from jobs.models import Job
from notifications.models import Notification
from provisioning.models import VM, PrivateNetwork, QuotaRule
from provisioning.opcodes import lifecycle
from reservations import blocks, services
from reservations.models import Reservation
from tests.environments.conftest import debian, make_template, member, router_image  # noqa: F401 (fixtures)

H = timedelta(hours=1)


@pytest.fixture
def lab(alice, debian, router_image, make_template):  # noqa: F811 (fixtures)
    return make_template(
        alice,
        [member("router", router_image, "left", entry=True, memory_mib=1024), member("client", debian, "left")],
        [{"name": "left", "cidr": "192.168.10.0/24"}],
        name="lab",
    )


@pytest.fixture
def host(make_host):
    return make_host("big", cpus=16, memory_mib=16384)


def machines(head):
    return {m.hostname: m for m in Reservation.objects.filter(pk=head.pk) | Reservation.objects.filter(head=head)}


@pytest.mark.parametrize("rule", [{"max_per_user": 1}, {"max_memory_mib": 1536}])
def test_an_environment_at_its_limit_still_extends(host, lab, alice, sync_jobs, rule):
    if "max_memory_mib" in rule:
        group = Group.objects.create(name="course")
        alice.groups.add(group)
        rule = {**rule, "group": group}
    QuotaRule.objects.create(name="the limit", **rule)
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    sync_jobs.drain()
    head = Reservation.objects.get(pk=head.pk)
    later = head.end + H
    services.extend(head, later, actor=alice)  # its own holdings do not count against its new end
    assert {r.end for r in machines(head).values()} == {later}


def test_an_extension_counts_the_machines_held_not_the_grown_template(host, lab, alice, debian, sync_jobs):  # noqa: F811
    group = Group.objects.create(name="course")
    alice.groups.add(group)
    QuotaRule.objects.create(name="the limit", group=group, max_memory_mib=1536)  # router 1024 + client 512
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    sync_jobs.drain()
    grown = [
        member("router", lab.members.get(entry=True).image, "left", entry=True, memory_mib=1024),
        member("client", debian, "left", count=3),
    ]
    templates.update_template(lab, actor=alice, members=grown)
    head = Reservation.objects.get(pk=head.pk)
    later = head.end + H
    services.extend(head, later, actor=alice)
    assert {r.end for r in machines(head).values()} == {later} and len(machines(head)) == 2


@pytest.mark.parametrize("how", ["end", "block"])
def test_an_environment_ended_before_it_was_built_frees_its_ranges(host, lab, alice, how):
    start = timezone.now() + 5 * H
    if how == "end":  # ending a future one cancels it
        head = services.reserve_environment(alice, lab, actor=alice, start=start, duration=2 * H)
        assert PrivateNetwork.objects.filter(removed__isnull=True).count() == 1
        services.end(Reservation.objects.get(pk=head.pk), actor=alice)
    else:
        image = lab.members.get(entry=True).image
        block = blocks.create_block(actor=alice, name="b", image=image, group=Group.objects.create(name="g"), seats=1,
                                    start=start, end=start + H, environment=lab)  # fmt: skip
        assert PrivateNetwork.objects.filter(removed__isnull=True).count() == 1
        blocks.cancel_block(block, actor=alice)
    assert set(Reservation.objects.values_list("status", flat=True)) == {"canceled"}
    assert not PrivateNetwork.objects.filter(removed__isnull=True).exists()


def test_the_last_machine_torn_down_removes_the_network_whatever_the_order(host, lab, alice, sync_jobs):
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    sync_jobs.drain()
    rows = list(machines(head).values())
    for row in rows:  # two workers: both destroy steps run before either release step
        lifecycle.destroy_on_host(row.vm_id)
    for row in rows:
        lifecycle.release(row.vm_id, actor="test")
    assert not SimVM.objects.exists() and not SimNetwork.objects.exists()
    assert not PrivateNetwork.objects.filter(removed__isnull=True).exists()


def test_a_machine_is_never_migrated_away_from_its_networks(make_host, host, lab, alice, admin_user, sync_jobs):
    other = make_host("big-2", cpus=16, memory_mib=16384)
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    sync_jobs.drain()
    client = machines(head)["client"]
    job = jobs.submit("vm.migrate", {"vm": client.vm_id, "target": other.pk}, actor=admin_user)
    sync_jobs.drain()
    assert Job.objects.get(pk=job.pk).status == "error" and VM.objects.get(pk=client.vm_id).host_id == host.pk


def test_its_user_hears_of_the_environment_once_not_of_each_machine(host, lab, alice, sync_jobs):
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    sync_jobs.drain()
    services.end(Reservation.objects.get(pk=head.pk), actor=alice)
    sync_jobs.drain()
    told = set(Notification.objects.filter(user=alice).values_list("data__id", flat=True))
    assert told == {head.pk}


@pytest.mark.parametrize("capped", ["entry", "other", "seat"])
def test_a_licence_cap_counts_every_copy_in_an_environment(host, alice, debian, router_image, make_template, capped):  # noqa: F811
    image = router_image if capped == "entry" else debian
    image.max_concurrent = 1
    image.save()
    template = make_template(
        alice,
        [member("router", router_image, "left", entry=True, count=1), member("c", debian, "left", count=2),
         *([member("r2", router_image, "left")] if capped == "entry" else [])],
        [{"name": "left", "cidr": "192.168.10.0/24"}],
        name="copies",
    )  # fmt: skip
    with pytest.raises(ValidationError, match=f"{image.name} may run at most 1 at once"):
        if capped == "seat":
            start = timezone.now() + 5 * H
            blocks.create_block(actor=alice, name="b", image=router_image, group=Group.objects.create(name="g"),
                                seats=1, start=start, end=start + H, environment=template)  # fmt: skip
        else:
            services.reserve_environment(alice, template, actor=alice, duration=2 * H)
    assert not Reservation.objects.exists()


def test_a_network_name_too_long_for_its_key_is_refused_with_the_template(alice, debian, router_image, make_template):  # noqa: F811
    name = "n" * 41
    with pytest.raises(ValidationError, match="at most 40 characters"):
        make_template(alice, [member("r", router_image, name, entry=True), member("c", debian, name)],
                      [{"name": name, "cidr": "192.168.10.0/24"}])  # fmt: skip
