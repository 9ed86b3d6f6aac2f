"""Console tickets and the console page: one-time, short-lived, bound to user, VM and kind,
stored as a digest; the page and the ticket endpoint are for the VM's owner and staff."""

import hashlib
import subprocess
import sys
from datetime import timedelta

import pytest
from django.utils import timezone

from console import services
from console.models import ConsoleTicket
from provisioning import services as vms
from provisioning.models import VM
from tests import processes
from tests.conftest import TEST
from tests.images import sim_image


@pytest.fixture
def sim_vm(db, alice, make_host):
    host = make_host("console-sim")
    image = sim_image("debian-12", actor=TEST, size_gib=0, os="Debian 12", default_disk_gib=5)
    vm, _ = vms.request_vm(actor=alice, owner=alice, image=image)
    VM.objects.filter(pk=vm.pk).update(state=VM.State.RUNNING, host=host)  # as its build job leaves it
    return VM.objects.get(pk=vm.pk)


def test_a_ticket_opens_its_console_once_and_only_its_digest_is_stored(sim_vm, alice):
    ticket = services.issue(alice, sim_vm, "vnc")
    row = ConsoleTicket.objects.get()
    assert row.digest == hashlib.sha256(ticket.encode()).hexdigest() and ticket not in row.digest
    session, vm = services.redeem(ticket, alice, sim_vm.pk, "vnc")
    assert session.pk == row.pk and vm.pk == sim_vm.pk
    assert ConsoleTicket.objects.get().used is not None
    with pytest.raises(services.Refused, match="used already"):
        services.redeem(ticket, alice, sim_vm.pk, "vnc")
    services.closed(session.pk)
    assert ConsoleTicket.objects.get().closed is not None


def test_an_expired_ticket_is_refused(sim_vm, alice, settings):
    ticket = services.issue(alice, sim_vm, "serial")
    row = ConsoleTicket.objects.get()
    assert row.expires - row.created <= timedelta(seconds=settings.CONSOLE_TICKET_SECONDS + 1)
    ConsoleTicket.objects.update(expires=timezone.now() - timedelta(seconds=1))
    with pytest.raises(services.Refused, match="expired"):
        services.redeem(ticket, alice, sim_vm.pk, "serial")


def test_another_users_ticket_is_refused_and_stays_its_owners(sim_vm, alice, bob, admin_user):
    ticket = services.issue(alice, sim_vm, "vnc")
    for someone in (bob, admin_user):  # staff too: a ticket is bound to the user it was issued to
        with pytest.raises(services.Refused, match="another user"):
            services.redeem(ticket, someone, sim_vm.pk, "vnc")
    services.redeem(ticket, alice, sim_vm.pk, "vnc")


def test_a_ticket_opens_no_other_console(sim_vm, alice):
    ticket = services.issue(alice, sim_vm, "vnc")
    with pytest.raises(services.Refused, match="another console"):
        services.redeem(ticket, alice, sim_vm.pk, "serial")
    with pytest.raises(services.Refused, match="another console"):
        services.redeem(ticket, alice, sim_vm.pk + 1, "vnc")
    for bad in ("", "x" * 500, None, "not-a-ticket"):
        with pytest.raises(services.Refused):
            services.redeem(bad, alice, sim_vm.pk, "vnc")


def test_only_owner_and_staff_get_tickets_and_a_lost_ownership_refuses_one(sim_vm, alice, bob, admin_user):
    with pytest.raises(services.Refused):
        services.issue(bob, sim_vm, "vnc")
    services.issue(admin_user, sim_vm, "vnc")
    ticket = services.issue(alice, sim_vm, "vnc")
    VM.objects.filter(pk=sim_vm.pk).update(owner=bob)
    with pytest.raises(services.Refused, match="owner and staff"):
        services.redeem(ticket, alice, sim_vm.pk, "vnc")


def test_a_stopped_vm_has_no_console(sim_vm, alice):
    ticket = services.issue(alice, sim_vm, "vnc")
    VM.objects.filter(pk=sim_vm.pk).update(state=VM.State.STOPPED)
    with pytest.raises(services.Refused, match="stopped"):
        services.redeem(ticket, alice, sim_vm.pk, "vnc")


def test_the_console_page_is_for_owner_and_staff(client, sim_vm, alice, bob, admin_user):
    url = f"/vms/{sim_vm.pk}/console/"
    assert client.get(url).status_code == 302  # to the sign-in page
    client.force_login(bob)
    assert client.get(url).status_code == 403
    assert client.post(f"{url}ticket/", {"kind": "vnc"}).status_code == 403
    assert not ConsoleTicket.objects.exists()
    for user in (alice, admin_user):
        client.force_login(user)
        page = client.get(url)
        assert page.status_code == 200 and b'id="vnc-screen"' in page.content
    assert client.get("/vms/999999/console/").status_code == 404


def test_the_sim_driver_says_clearly_there_is_no_console(client, sim_vm, alice):
    client.force_login(alice)
    answer = client.post(f"/vms/{sim_vm.pk}/console/ticket/", {"kind": "vnc"})
    assert answer.status_code == 409 and "simulated VM" in answer.json()["error"]
    assert client.post(f"/vms/{sim_vm.pk}/console/ticket/", {"kind": "bogus"}).status_code == 400
    serial = client.post(f"/vms/{sim_vm.pk}/console/ticket/", {"kind": "serial"})
    assert serial.status_code == 200 and serial.json()["url"].startswith(f"/ws/console/{sim_vm.pk}/serial/?ticket=")
    assert serial["Cache-Control"] == "no-store" or "no-store" in serial["Cache-Control"]


def test_the_vm_page_links_the_console_of_a_running_vm_only(client, sim_vm, alice):
    client.force_login(alice)
    assert b'id="open-console"' in client.get(f"/vms/{sim_vm.pk}/").content
    VM.objects.filter(pk=sim_vm.pk).update(state=VM.State.STOPPED)
    assert b'id="open-console"' not in client.get(f"/vms/{sim_vm.pk}/").content
    answer = client.post(f"/vms/{sim_vm.pk}/console/ticket/", {"kind": "serial"})
    assert answer.status_code == 409 and "stopped" in answer.json()["error"]
    assert not ConsoleTicket.objects.exists()


REDEEM = """
import os, django
django.setup()
from django.contrib.auth import get_user_model
from console import services
user = get_user_model().objects.get(pk=int(os.environ["TICKET_USER"]))
try:
    services.redeem(os.environ["TICKET"], user, int(os.environ["TICKET_VM"]), "vnc")
    print("opened")
except services.Refused as exc:
    print("refused:", exc)
"""


def redeem_in(processes_count, ticket, user, vm):
    """What each of ``processes_count`` processes started at once says when it redeems ``ticket``."""
    env = processes.child_env(TICKET=ticket, TICKET_USER=user.pk, TICKET_VM=vm.pk)
    children = [
        subprocess.Popen(
            [sys.executable, "-c", REDEEM],
            cwd=processes.ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(processes_count)
    ]
    try:
        return sorted(child.communicate(timeout=60)[0].strip().splitlines()[-1] for child in children)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()


@pytest.mark.django_db(transaction=True)
def test_a_ticket_opens_one_console_across_processes_and_none_once_expired(sim_vm, alice):
    ticket = services.issue(alice, sim_vm, "vnc")
    said = redeem_in(2, ticket, alice, sim_vm)
    assert said == ["opened", "refused: this console ticket was used already"], said
    late = services.issue(alice, sim_vm, "vnc")
    ConsoleTicket.objects.filter(used__isnull=True).update(expires=timezone.now() - timedelta(seconds=1))
    assert redeem_in(1, late, alice, sim_vm) == ["refused: this console ticket expired"]
