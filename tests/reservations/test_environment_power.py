"""An environment suspended, resumed and reverted as one, on the simulator: every machine or none,
its claims kept whole, a failed machine named and the others put back; through the service,
the API, the page and the command line; only by its owner or an administrator."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from accounts import access
from capacity.models import Allocation
from core import events
from core.errors import Conflict
from core.models import ObjectChange
from drivers.sim.models import SimVM
from jobs.models import Job
from provisioning import services as vms
from provisioning.models import VM
from reservations import services
from reservations.models import Reservation
from tests.environments.conftest import debian, make_template, router_image, trio  # noqa: F401 (fixtures)

H = timedelta(hours=1)


@pytest.fixture
def ready(make_host, trio, alice, sync_jobs):  # noqa: F811 (fixture)
    """Alice's environment of ``trio``, built and ready; its head."""
    make_host("big", cpus=16, memory_mib=16384)
    head = services.reserve_environment(alice, trio, actor=alice, duration=2 * H)
    sync_jobs.drain()
    head = Reservation.objects.get(pk=head.pk)
    assert head.status == "ready"
    return head


@pytest.fixture
def clean_images(debian, router_image):  # noqa: F811 (fixtures)
    """Both images revert on end: every machine keeps a clean snapshot taken before its first boot."""
    for image in (debian, router_image):
        vms.update_image(image, actor="test", revert_on_end=True)


def states(head):
    """hostname -> (the VM's state as vclmgr has it, the simulated host's)."""
    rows = Reservation.objects.filter(pk=head.pk) | Reservation.objects.filter(head=head)
    return {r.hostname: (r.vm.state, SimVM.objects.get(key=r.vm.key).state) for r in rows.select_related("vm")}


def claims(head):
    rows = Reservation.objects.filter(pk=head.pk) | Reservation.objects.filter(head=head)
    return {
        (a.pk, a.vcpus, a.memory_mib, a.released)
        for a in Allocation.objects.filter(pk__in=rows.values("vm__allocation"))
    }


def history(head):
    return list(head.history.order_by("pk").values_list("reason", flat=True))


def test_suspend_and_resume_act_on_every_machine_and_keep_their_claims(ready, alice, sync_jobs):
    held = claims(ready)
    job = services.suspend(ready, actor=alice)
    assert job.opcode == "reservation.suspend" and job.submitter == alice
    sync_jobs.drain()
    assert Job.objects.get(pk=job.pk).status == "success"
    assert states(ready) == dict.fromkeys(["router", "client", "server"], ("suspended", "suspended"))
    # A suspended environment holds its place until its end, as a VM its user suspends does.
    assert claims(ready) == held and all(released is None for *_, released in held)
    assert Reservation.objects.get(pk=ready.pk).status == "ready"
    assert history(ready)[-1] == "suspended: router, client, server"
    with pytest.raises(Conflict, match="it is suspended already"):
        services.suspend(ready, actor=alice)

    services.resume(ready, actor=alice)
    sync_jobs.drain()
    assert states(ready) == dict.fromkeys(["router", "client", "server"], ("running", "running"))
    assert claims(ready) == held
    assert history(ready)[-1] == "resumed: router, client, server"


def test_the_head_page_is_told_each_machines_state(ready, alice, sync_jobs):
    """What the live page hears (its topics: the head's and its owner's): every machine's VM."""
    page_topics = [f"reservation.{ready.pk}", f"user.{alice.pk}"]
    before = events.since(page_topics, 0)[-1].pk
    services.suspend(ready, actor=alice)
    sync_jobs.drain()
    heard = events.since(page_topics, before)
    machines = {m.vm_id: m.hostname for m in services.machines_of(ready)}
    vms_heard = [e.data for e in heard if e.kind == "vm.changed"]
    assert {machines[d["id"]] for d in vms_heard if d["state"] == "suspended"} == {"router", "client", "server"}
    # The head's own topic (any follower of the reservation) hears every machine's state at the end.
    [told] = [
        e.data
        for e in heard
        if e.topic == f"reservation.{ready.pk}"
        and e.kind == "reservation.changed"
        and e.data["reason"].startswith("suspended:")
    ]
    assert [(m["hostname"], m["vm_state"]) for m in told["machines"]] == [
        ("router", "suspended"),
        ("client", "suspended"),
        ("server", "suspended"),
    ]


def test_a_machine_alone_refuses_the_verbs_naming_its_head(ready, alice):
    client = Reservation.objects.get(head=ready, hostname="client")
    for verb in (services.suspend, services.resume, services.revert):
        with pytest.raises(Conflict, match=f"machine client of environment reservation {ready.pk}: act on that one"):
            verb(client, actor=alice)
    assert not Job.objects.filter(opcode__startswith="reservation.").exists()


def test_only_a_ready_environment_is_suspended(make_host, trio, alice, debian):  # noqa: F811 (fixtures)
    make_host("big", cpus=16, memory_mib=16384)
    head = services.reserve_environment(alice, trio, actor=alice, duration=2 * H)
    with pytest.raises(Conflict, match=f"environment reservation {head.pk} is provisioning: only a ready one"):
        services.suspend(head, actor=alice)
    single = services.reserve(alice, debian, actor=alice, duration=H)
    with pytest.raises(Conflict, match=f"reservation {single.pk} is no environment: suspend its VM itself"):
        services.suspend(single, actor=alice)


def test_a_machine_that_cannot_be_suspended_is_named_and_the_others_resumed_again(ready, alice, sync_jobs):
    # The server's guest shut itself down: vclmgr still has it running, its host has it stopped.
    server = Reservation.objects.get(head=ready, hostname="server")
    SimVM.objects.filter(key=server.vm.key).update(state="stopped")
    job = services.suspend(ready, actor=alice)
    sync_jobs.drain()
    job = Job.objects.get(pk=job.pk)
    assert job.status == "error"
    assert f"server could not be suspended: cannot suspend {server.vm.key}: it is stopped" in job.error_message
    assert "resumed again: router, client" in job.error_message
    # Nothing is left half-suspended: the others run again, and the head's page says what happened.
    found = states(ready)
    assert found["router"] == found["client"] == ("running", "running")
    assert history(ready)[-1].startswith("server could not be suspended")


def test_a_machine_that_cannot_be_resumed_is_named_and_the_others_suspended_again(ready, alice, sync_jobs):
    services.suspend(ready, actor=alice)
    sync_jobs.drain()
    client = Reservation.objects.get(head=ready, hostname="client")
    SimVM.objects.filter(key=client.vm.key).update(state="stopped")  # its saved memory was lost on the host
    job = services.resume(ready, actor=alice)
    sync_jobs.drain()
    job = Job.objects.get(pk=job.pk)
    assert job.status == "error" and "client could not be resumed" in job.error_message
    assert "suspended again: router" in job.error_message
    found = states(ready)
    assert found["router"] == found["server"] == ("suspended", "suspended")  # the server was never resumed


def test_revert_is_refused_when_an_image_keeps_no_snapshot(ready, alice):
    with pytest.raises(Conflict) as refused:
        services.revert(ready, actor=alice)
    words = str(refused.value)
    assert "router (vyos), client (debian-12), server (debian-12) keep no clean snapshot" in words
    assert "only a machine of an image that reverts on end keeps one" in words
    assert not Job.objects.filter(opcode="reservation.revert").exists()


def test_revert_brings_every_machine_back_to_its_clean_state_running(clean_images, ready, alice, sync_jobs):
    held = claims(ready)
    services.suspend(ready, actor=alice)
    sync_jobs.drain()
    job = services.revert(ready, actor=alice)  # from suspended: off first, then back to the clean snapshot
    sync_jobs.drain()
    assert Job.objects.get(pk=job.pk).status == "success", Job.objects.get(pk=job.pk).error_message
    assert states(ready) == dict.fromkeys(["router", "client", "server"], ("running", "running"))
    for machine in services.machines_of(ready):
        assert machine.vm.address
        changes = ObjectChange.objects.filter(content_type__model="vm", object_id=str(machine.vm_id))
        assert changes.filter(reason="stopped to revert to its clean state").exists()
    assert claims(ready) == held
    assert history(ready)[-1] == "reverted: router, client, server"


def test_a_failed_revert_names_the_machine_and_starts_every_machine_again(clean_images, ready, alice, sync_jobs):
    # The client's clean snapshot is gone from its host (vclmgr still lists it).
    client = Reservation.objects.get(head=ready, hostname="client")
    SimVM.objects.filter(key=client.vm.key).update(snapshots=[])
    job = services.revert(ready, actor=alice)
    sync_jobs.drain()
    job = Job.objects.get(pk=job.pk)
    assert job.status == "error" and "client could not be reverted" in job.error_message
    assert "reverted before it: router; every machine was started again" in job.error_message
    assert states(ready) == dict.fromkeys(["router", "client", "server"], ("running", "running"))


def test_the_api_acts_for_the_owner_and_administrators_only(ready, alice, bob, admin_user, api, sync_jobs):
    url = f"/api/v1/reservations/{ready.pk}"
    auditor = type(bob).objects.create_user("audrey", "audrey@example.org", "audrey-pass-1")
    access.set_roles(auditor, ["auditor"], actor="test")
    assert api(auditor).get(f"{url}/").status_code == 200  # she may read it, not act on it
    for stranger in (bob, auditor):
        assert api(stranger).post(f"{url}/suspend/").status_code == 404
    assert not Job.objects.filter(opcode__startswith="reservation.").exists()

    response = api(alice).post(f"{url}/suspend/")
    assert response.status_code == 202, response.json()
    assert response.json()["job"] and response["Location"].endswith(f"/jobs/{response.json()['job']}/")
    sync_jobs.drain()
    followed = api(alice).get(response["Location"])  # the job is hers to follow
    assert followed.status_code == 200 and followed.json()["status"] == "success"
    detail = api(alice).get(f"{url}/").json()
    assert {m["vm_state"] for m in detail["machines"]} == {"suspended"}
    again = api(alice).post(f"{url}/suspend/")
    assert again.status_code == 409 and "suspended already" in str(again.json())
    assert api(admin_user).post(f"{url}/resume/").status_code == 202
    sync_jobs.drain()
    assert {m["vm_state"] for m in api(alice).get(f"{url}/").json()["machines"]} == {"running"}

    refused = api(alice).post(f"{url}/revert/")
    assert refused.status_code == 409 and "keep no clean snapshot" in str(refused.json())
    machine = Reservation.objects.get(head=ready, hostname="server")
    alone = api(alice).post(f"/api/v1/reservations/{machine.pk}/suspend/")
    assert alone.status_code == 409 and f"environment reservation {ready.pk}" in str(alone.json())


def test_the_page_offers_what_fits_and_acts_as_one(ready, alice, bob, client, sync_jobs):
    client.force_login(alice)
    page = client.get(f"/reservations/{ready.pk}/").content.decode()
    assert 'id="suspend-all"' in page and 'id="resume-all"' not in page
    assert 'id="revert-all"' not in page  # its images keep no clean snapshot
    for machine in services.machines_of(ready):  # each machine's VM state, for the live updates
        assert f'data-vm="{machine.vm_id}"' in page
    done = client.post(f"/reservations/{ready.pk}/suspend/", follow=True)
    assert "Suspending every machine of the environment." in done.content.decode()
    sync_jobs.drain()
    page = client.get(f"/reservations/{ready.pk}/panel/").content.decode()
    assert 'id="resume-all"' in page and 'id="suspend-all"' not in page
    assert page.count('<td data-field="machine-vm">suspended</td>') == 3
    server = Reservation.objects.get(head=ready, hostname="server")
    refused = client.post(f"/reservations/{server.pk}/resume/", follow=True)
    assert f"environment reservation {ready.pk}: act on that one" in refused.content.decode()
    assert 'id="resume-all"' not in client.get(f"/reservations/{server.pk}/").content.decode()

    client.force_login(bob)
    assert client.post(f"/reservations/{ready.pk}/resume/").status_code == 404
    assert {vm for vm, _ in states(ready).values()} == {"suspended"}


def test_the_command_line_suspends_and_resumes_an_environment(ready, sync_jobs):
    out = StringIO()
    call_command("reservation", "suspend", str(ready.pk), stdout=out)
    assert out.getvalue().startswith(f"reservation {ready.pk}: suspending every machine (job ")
    sync_jobs.drain()
    assert {vm for vm, _ in states(ready).values()} == {"suspended"}
    call_command("reservation", "resume", str(ready.pk), stdout=StringIO())
    sync_jobs.drain()
    assert {vm for vm, _ in states(ready).values()} == {"running"}
    with pytest.raises(CommandError, match="keep no clean snapshot"):
        call_command("reservation", "revert", str(ready.pk), stdout=StringIO())


def test_a_suspended_environment_ends_whole(ready, alice, sync_jobs):
    services.suspend(ready, actor=alice)
    sync_jobs.drain()
    services.end(Reservation.objects.get(pk=ready.pk), actor=alice)
    sync_jobs.drain()
    assert set(Reservation.objects.filter(environment__isnull=False).values_list("status", flat=True)) == {"ended"}
    assert set(VM.objects.values_list("state", flat=True)) == {"destroyed"}
    assert not Allocation.objects.filter(released__isnull=True).exists()
