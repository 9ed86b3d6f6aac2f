"""Environment reservations on the simulator: every machine of a template as one reservation,
placed all or nothing, built with its private networks, ready together, ended together."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.utils import timezone

from capacity.models import Allocation
from capacity.snapshot import snapshot
from core.errors import Conflict
from drivers.sim.models import SimNetwork, SimNIC, SimVM
from jobs.models import Job
from provisioning.models import VM, PrivateNetwork, QuotaRule
from reservations import services
from reservations.models import Refusal, Reservation
from tests.environments.conftest import debian, make_template, member, router_image  # noqa: F401 (fixtures)

H = timedelta(hours=1)


@pytest.fixture
def lab(alice, debian, router_image, make_template):  # noqa: F811 (fixtures)
    """A router on two networks, one client on each (the second network's range picked)."""
    return make_template(
        alice,
        [
            member("router", router_image, "left", "right", entry=True, memory_mib=1024),
            member("client", debian, "left", memory_mib=512),
            member("server", debian, "right", memory_mib=512),
        ],
        [{"name": "left", "cidr": "192.168.10.0/24"}, {"name": "right", "cidr": "192.168.20.0/24"}],
        name="lab",
    )


def machines(head):
    return {m.hostname: m for m in Reservation.objects.filter(pk=head.pk) | Reservation.objects.filter(head=head)}


def test_an_environment_is_reserved_built_and_ready_as_one(make_host, lab, alice, sync_jobs):
    host = make_host("big", cpus=16, memory_mib=16384)
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    rows = machines(head)
    assert set(rows) == {"router", "client", "server"} and head.hostname == "router" and head.head_id is None
    assert all(r.head_id == head.pk for name, r in rows.items() if name != "router")
    assert {r.allocation.host_id for r in rows.values()} == {host.pk}  # one host: their networks join them
    assert {r.status for r in rows.values()} == {"provisioning"}
    # One login for all: its user goes from the entry machine to the others.
    assert len({(r.connect_user, r.connect_secret) for r in rows.values()}) == 1
    sync_jobs.drain()
    rows = machines(head)
    assert {name: r.status for name, r in rows.items()} == dict.fromkeys(rows, "ready"), [
        r.error for r in rows.values()
    ]
    # The private networks exist on the host, each machine on its own, at its fixed address by name.
    nets = {n.key: n for n in SimNetwork.objects.filter(host__name="big")}
    assert set(nets) == {f"env{head.pk}-left", f"env{head.pk}-right"}
    assert [h for h, _mac in nets[f"env{head.pk}-left"].hosts] == ["client", "router"]  # in template order
    router_vm = SimVM.objects.get(key=rows["router"].vm.key)
    assert {nic.network.key for nic in SimNIC.objects.filter(vm=router_vm)} == set(nets)
    client_vm = SimVM.objects.get(key=rows["client"].vm.key)
    assert [nic.network.key for nic in SimNIC.objects.filter(vm=client_vm)] == [f"env{head.pk}-left"]
    assert rows["client"].vm.hostname == "client"
    # The head's page data: every machine, with its status.
    assert [m.hostname for m in services.machines_of(head)] == ["router", "client", "server"]

    services.end(Reservation.objects.get(pk=head.pk), actor=alice)
    sync_jobs.drain()
    rows = machines(head)
    assert {r.status for r in rows.values()} == {"ended"}
    assert not SimVM.objects.filter(host__name="big").exists()
    assert not SimNetwork.objects.filter(host__name="big").exists()  # removed with their last machine
    assert not PrivateNetwork.objects.filter(removed__isnull=True).exists()
    assert not Allocation.objects.filter(host=host, released__isnull=True).exists()


def test_the_head_waits_for_its_last_machine(make_host, lab, alice, sync_jobs):
    make_host("big", cpus=16, memory_mib=16384)
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    # The head's VM is built first (its job is the oldest): running, yet the environment is not ready.
    assert Job.objects.filter(opcode="vm.create").order_by("pk").first().params["vm"] == head.vm_id
    sync_jobs.run_one()
    head.refresh_from_db()
    assert head.vm.state == "running" and head.status == "provisioning"
    sync_jobs.drain()
    assert Reservation.objects.get(pk=head.pk).status == "ready"


def test_a_machine_alone_is_not_ended_or_extended(make_host, lab, alice, sync_jobs):
    make_host("big", cpus=16, memory_mib=16384)
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    sync_jobs.drain()
    client = machines(head)["client"]
    with pytest.raises(Conflict, match=f"machine client of environment reservation {head.pk}"):
        services.end(client, actor=alice)
    with pytest.raises(Conflict, match="act on that one"):
        services.extend(client, client.end + H, actor=alice)
    # The head extends them all.
    head = Reservation.objects.get(pk=head.pk)
    later = head.end + H
    services.extend(head, later, actor=alice)
    assert {r.end for r in machines(head).values()} == {later}
    assert {r.allocation.end for r in machines(head).values()} == {later}


def test_no_room_for_every_machine_refuses_it_whole_and_writes_nothing(make_host, lab, alice):
    make_host("small-1", cpus=2, memory_mib=1536)  # the router fits, not all three
    make_host("small-2", cpus=2, memory_mib=1536)
    with pytest.raises(ValidationError) as refused:
        services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    words = refused.value.message_dict["start"][0]
    assert "must share a host" in words and "together need" in words
    assert "it does not fit at any time soon" in words
    assert not Reservation.objects.exists() and not Allocation.objects.exists()
    assert not PrivateNetwork.objects.exists()
    assert Refusal.objects.filter(user=alice).count() == 1


def test_a_refusal_names_the_earliest_start_for_every_machine_once(make_host, lab, alice, bob):
    make_host("big", cpus=4, memory_mib=2048)  # room for one lab (2048 MiB) at a time
    lab.visibility = "public"
    lab.save(update_fields=["visibility"])
    first = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    ends = {a.end for a in Allocation.objects.filter(released__isnull=True)}
    assert len(ends) == 1
    with pytest.raises(ValidationError) as refused:
        services.reserve_environment(bob, lab, actor=bob, duration=H)
    [words] = refused.value.message_dict["start"]
    earliest = f"{timezone.localtime(ends.pop()):%Y-%m-%d %H:%M %Z}"
    assert words.endswith(f"; the earliest start that fits every machine is {earliest}"), words
    assert "earliest" not in words.removesuffix(f"; the earliest start that fits every machine is {earliest}")
    assert Reservation.objects.count() == len(machines(first))


def test_quotas_count_an_environment_once_and_its_machines_sizes_all(make_host, lab, alice):
    make_host("big", cpus=16, memory_mib=16384)
    alice.groups.add(group := Group.objects.create(name="netcourse"))
    QuotaRule.objects.create(name="one each", max_per_user=1)
    QuotaRule.objects.create(name="course memory", group=group, max_memory_mib=1536)
    with pytest.raises(ValidationError) as refused:  # 1024 + 512 + 512
        services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    assert "group netcourse already holds 0 MiB of memory at that time; 2048 more would make 2048" in str(refused.value)
    assert not Reservation.objects.exists() and not Allocation.objects.exists()
    QuotaRule.objects.filter(name="course memory").update(max_memory_mib=2048)
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)  # one reservation of three machines
    assert len(machines(head)) == 3
    with pytest.raises(ValidationError, match="you already have 1 reservation or VM at that time; at most 1"):
        services.reserve_environment(alice, lab, actor=alice, duration=2 * H)


def test_a_second_environment_on_the_host_gets_other_ranges(make_host, lab, alice, sync_jobs):
    make_host("big", cpus=16, memory_mib=16384)
    first = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    second = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    sync_jobs.drain()
    ranges = {n.key: n.cidr for n in SimNetwork.objects.all()}
    assert ranges[f"env{first.pk}-left"] == "192.168.10.0/24"
    assert ranges[f"env{second.pk}-left"] not in ("192.168.10.0/24", "192.168.20.0/24")
    assert len(set(ranges.values())) == 4
    assert {r.status for r in machines(second).values()} == {"ready"}


def test_a_machine_that_fails_to_build_ends_the_whole_environment(make_host, lab, alice, sync_jobs):
    from drivers.sim import services as sim

    host = make_host("big", cpus=16, memory_mib=16384)
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    sim.set_fault(host.name, "start", "fail_once")  # the first machine to boot fails; it is not retried
    sync_jobs.drain()
    rows = machines(head)
    failed = [name for name, r in rows.items() if r.status == "failed"]
    assert len(failed) == 1 and {r.status for name, r in rows.items() if name != failed[0]} == {"ended"}
    head = Reservation.objects.get(pk=head.pk)
    assert f"the environment failed: {failed[0]} could not be built" in head.error
    assert not SimVM.objects.filter(host__name="big").exists()
    assert not SimNetwork.objects.filter(host__name="big").exists()
    assert not VM.objects.exclude(state__in=("destroyed", "failed")).exists()
    assert not Allocation.objects.filter(host=host, released__isnull=True).exists()


def test_a_future_environment_starts_at_its_lead_time_and_cancels_whole(make_host, lab, alice, sync_jobs):
    make_host("big", cpus=16, memory_mib=16384)
    start = timezone.now() + 3 * H
    head = services.reserve_environment(alice, lab, actor=alice, start=start, duration=H)
    assert {r.status for r in machines(head).values()} == {"pending"}
    services.cancel(Reservation.objects.get(pk=head.pk), actor=alice)
    assert {r.status for r in machines(head).values()} == {"canceled"}
    assert not Allocation.objects.filter(released__isnull=True).exists()
    assert not PrivateNetwork.objects.filter(removed__isnull=True).exists()  # its ranges are free again

    later = services.reserve_environment(alice, lab, actor=alice, start=start, duration=H)
    services.tick(now=start - timedelta(minutes=1))
    sync_jobs.drain()
    assert {r.status for r in machines(later).values()} == {"ready"}


def test_it_refuses_a_template_the_user_may_not_see(make_host, lab, bob):
    make_host("big", cpus=16, memory_mib=16384)
    with pytest.raises(ValidationError, match="no such environment, or you may not use it"):
        services.reserve_environment(bob, lab, actor=bob, duration=H)
    with pytest.raises(ValidationError, match="no such environment, or you may not use it"):
        services.visible_environment(bob, lab.pk)


def test_the_api_reserves_an_environment_and_shows_its_machines(make_host, lab, alice, bob, api, sync_jobs):
    make_host("big", cpus=16, memory_mib=16384)
    url = "/api/v1/reservations/"
    both = api(alice).post(url, {"image": lab.members.first().image_id, "environment": lab.pk, "duration_minutes": 60})
    assert both.status_code == 400 and "give either image or environment" in str(both.json())
    hidden = api(bob).post(url, {"environment": lab.pk, "duration_minutes": 60}, format="json")
    missing = api(bob).post(url, {"environment": 999999, "duration_minutes": 60}, format="json")
    assert hidden.status_code == missing.status_code == 400
    assert hidden.json() == missing.json()  # nothing tells one from the other
    assert "no such environment, or you may not use it" in str(hidden.json())

    response = api(alice).post(url, {"environment": lab.pk, "duration_minutes": 60}, format="json")
    assert response.status_code == 202, response.json()
    head = response.json()["reservation"]
    assert head["environment"] == lab.pk and head["hostname"] == "router" and head["head"] is None
    assert [m["hostname"] for m in head["machines"]] == ["router", "client", "server"]
    sync_jobs.drain()
    detail = api(alice).get(f"{url}{head['id']}/").json()
    assert detail["status"] == "ready" and detail["connection"]["password"]
    assert {m["status"] for m in detail["machines"]} == {"ready"} and all(m["address"] for m in detail["machines"])
    client = next(m for m in detail["machines"] if m["hostname"] == "client")
    assert api(alice).get(f"{url}{client['id']}/").json()["head"] == head["id"]
    refused = api(alice).post(f"{url}{client['id']}/end/")
    assert refused.status_code == 409 and f"environment reservation {head['id']}" in str(refused.json())
    assert api(bob).get(f"{url}{head['id']}/").status_code == 404
    assert api(alice).post(f"{url}{head['id']}/end/").status_code in (200, 202)
    sync_jobs.drain()
    assert {m.status for m in machines(Reservation.objects.get(pk=head["id"])).values()} == {"ended"}


def test_the_head_page_lists_its_machines_and_a_machine_links_its_head(make_host, lab, alice, client, sync_jobs):
    make_host("big", cpus=16, memory_mib=16384)
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    sync_jobs.drain()
    client.force_login(alice)
    page = client.get(f"/reservations/{head.pk}/").content.decode()
    assert 'id="machines"' in page and page.count("data-machine=") == 3
    assert "entry machine <strong>router</strong>" in page and 'id="extend-form"' in page
    server = machines(head)["server"]
    page = client.get(f"/reservations/{server.pk}/").content.decode()
    assert f'href="/reservations/{head.pk}/" id="environment-head"' in page
    assert 'id="extend-form"' not in page and 'id="machines"' not in page


def test_the_environment_page_reserves_it_now_or_says_why_not(make_host, lab, alice, bob, client, sync_jobs):
    client.force_login(alice)
    page = client.get(f"/environments/{lab.pk}/").content.decode()
    assert f'href="/reservations/environments/{lab.pk}/new/"' in page
    form = client.get(f"/reservations/environments/{lab.pk}/new/")
    key = form.context["form"].initial["request_key"]
    body = {"when": "now", "duration": 60, "ssh_key": "", "request_key": key}
    refused = client.post(f"/reservations/environments/{lab.pk}/new/", body)  # no host yet
    assert refused.status_code == 200 and "does not fit" in refused.content.decode()
    assert not Reservation.objects.exists()
    make_host("big", cpus=16, memory_mib=16384)
    snapshot.expire()  # (hosts are looked for at most once a second)
    made = client.post(f"/reservations/environments/{lab.pk}/new/", body)
    head = Reservation.objects.get(head__isnull=True)
    assert made.status_code == 302 and made["Location"] == f"/reservations/{head.pk}/"
    assert client.post(f"/reservations/environments/{lab.pk}/new/", body)["Location"] == made["Location"]  # once
    client.force_login(bob)
    assert client.get(f"/reservations/environments/{lab.pk}/new/").status_code == 404


def test_administrators_see_the_networks_in_the_admin_and_change_none(make_host, lab, alice, admin_client):
    make_host("big", cpus=16, memory_mib=16384)
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    page = admin_client.get("/admin/vms/privatenetwork/")
    assert page.status_code == 200 and f"env{head.pk}-left" in page.content.decode()
    network = PrivateNetwork.objects.get(key=f"env{head.pk}-left")
    assert admin_client.post(f"/admin/vms/privatenetwork/{network.pk}/delete/", {"post": "yes"}).status_code == 403
    assert PrivateNetwork.objects.filter(pk=network.pk).exists()


def kill_host(dead, sync_jobs, settings):
    """The host stops answering: drained, then offline (its VMs lost), as ``refresh_all`` finds."""
    from drivers.sim import services as sim
    from provisioning import tasks

    settings.HOST_OFFLINE_AFTER_CHECKS = 2
    sim.ensure_host(dead.name)
    sim.set_fault(dead.name, "*", "unreachable")
    for _ in range(2):
        tasks.refresh_all()
        sync_jobs.drain()


def test_a_dead_hosts_environment_is_built_again_whole_on_another_host(make_host, lab, alice, sync_jobs, settings):
    from core.models import Event

    dead = make_host("big", cpus=16, memory_mib=16384)
    spare = make_host("spare", cpus=16, memory_mib=16384)
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    sync_jobs.drain()
    old = {n: r.vm_id for n, r in machines(head).items()}
    assert {r.status for r in machines(head).values()} == {"ready"}
    kill_host(dead, sync_jobs, settings)
    rows = machines(head)
    assert {n: r.status for n, r in rows.items()} == dict.fromkeys(rows, "ready"), {n: r.error for n, r in rows.items()}
    # Every machine on the spare, together (their networks join them), each as a new VM.
    assert {r.allocation.host_id for r in rows.values()} == {spare.pk}
    assert {VM.objects.get(pk=r.vm_id).host_id for r in rows.values()} == {spare.pk}
    assert all(r.vm_id != old[n] and r.attempts == 2 for n, r in rows.items())
    assert set(VM.objects.filter(pk__in=old.values()).values_list("state", flat=True)) == {"lost"}
    assert set(SimNetwork.objects.filter(host__name="spare").values_list("key", flat=True)) == {
        f"env{head.pk}r2-left",
        f"env{head.pk}r2-right",
    }
    assert not Allocation.objects.filter(host=dead, released__isnull=True).exists()
    trail = " ".join(Reservation.objects.get(pk=head.pk).history.values_list("reason", flat=True))
    assert "failed on big: its host big stopped answering" in trail and "on spare after" in trail, trail
    assert {e.data["outcome"] for e in Event.objects.filter(kind="reservation.host_lost")} == {"rebuilding"}


def test_machines_whose_host_dies_before_they_are_built_are_built_together_elsewhere(
    make_host, lab, alice, sync_jobs, settings
):
    one = make_host("one", cpus=16, memory_mib=16384)
    two = make_host("two", cpus=16, memory_mib=16384)
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    assert {r.allocation.host_id for r in machines(head).values()} == {one.pk}
    kill_host(one, sync_jobs, settings)  # (their builds run meanwhile, and fail there)
    rows = machines(head)
    assert {n: r.status for n, r in rows.items()} == dict.fromkeys(rows, "ready"), {n: r.error for n, r in rows.items()}
    assert {VM.objects.get(pk=r.vm_id).host_id for r in rows.values()} == {two.pk}
    assert {r.attempts for r in rows.values()} == {2}  # once each, together
    assert not Allocation.objects.filter(host=one, released__isnull=True).exists()


def test_a_dead_hosts_environment_with_no_room_elsewhere_fails_whole(make_host, lab, alice, sync_jobs, settings):
    dead = make_host("big", cpus=16, memory_mib=16384)
    make_host("small", cpus=16, memory_mib=1024)  # one machine would fit, the three together do not
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    sync_jobs.drain()
    kill_host(dead, sync_jobs, settings)
    rows = machines(head)
    assert {r.status for r in rows.values()} <= {"failed", "ended"} and "failed" in {r.status for r in rows.values()}
    error = Reservation.objects.get(pk=head.pk).error
    assert "the environment failed" in error and "stopped answering" in error and "no other host" in error, error
    assert set(VM.objects.values_list("state", flat=True)) == {"lost"}  # none rebuilt alone on the small host
    assert not Allocation.objects.filter(released__isnull=True).exists()


def test_a_future_environment_on_a_host_that_leaves_service_is_flagged_not_split(make_host, lab, alice, sync_jobs):
    from inventory import services as inventory

    host = make_host("big", cpus=16, memory_mib=16384)
    make_host("spare", cpus=16, memory_mib=16384)
    head = services.reserve_environment(alice, lab, actor=alice, start=timezone.now() + 3 * H, duration=H)
    inventory.set_state(host, "drained", "firmware", actor="test")
    sync_jobs.drain()
    rows = machines(head)
    assert {r.allocation.host_id for r in rows.values()} == {host.pk}  # kept together where they were
    assert all("not moved apart from one another" in r.degraded for r in rows.values())


def test_the_reserve_form_offers_durations_within_the_strictest_of_its_images(lab, alice, debian, client):  # noqa: F811
    QuotaRule.objects.create(name="short clients", image=debian, max_duration_minutes=90)  # not the entry's image
    client.force_login(alice)
    form = client.get(f"/reservations/environments/{lab.pk}/new/").context["form"]
    assert max(minutes for minutes, _ in form.fields["duration"].choices) <= 90
    assert form.fields["duration"].help_text == "At most 1 h 30 min (rule 'short clients')."


def test_a_host_loss_locks_the_environments_head_before_its_machine(
    make_host, lab, alice, sync_jobs, settings, monkeypatch
):
    from django.db.models.query import QuerySet

    dead = make_host("big", cpus=16, memory_mib=16384)
    make_host("spare", cpus=16, memory_mib=16384)
    head = services.reserve_environment(alice, lab, actor=alice, duration=2 * H)
    sync_jobs.drain()
    locked, get = [], QuerySet.get

    def recording(self, *args, **kwargs):
        row = get(self, *args, **kwargs)
        if self.model is Reservation and self.query.select_for_update:
            locked.append(row.pk)
        return row

    monkeypatch.setattr(QuerySet, "get", recording)
    kill_host(dead, sync_jobs, settings)
    assert {r.status for r in machines(head).values()} == {"ready"}
    # The lock order a failed build's settle takes too: the head's row before any machine's,
    # so the two never each hold one machine and wait for the other (PostgreSQL deadlocks).
    assert any(pk != head.pk for pk in locked), locked
    assert all(locked[i - 1] == head.pk for i, pk in enumerate(locked) if pk != head.pk), locked
