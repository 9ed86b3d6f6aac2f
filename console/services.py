"""The web console's verbs: who may open it, its one-time tickets, and reaching the VM's
console through the host's driver.

A ticket is 32 random bytes (URL-safe), stored only as its SHA-256 digest, bound to one user,
one VM and one kind (``vnc`` or ``serial``), valid ``CONSOLE_TICKET_SECONDS`` and spent by the
first websocket that presents it: a reused, expired, someone else's or another VM's ticket is
refused. The websocket also needs the same signed-in user (its session), so a ticket that leaks
(it travels in the websocket URL, noVNC's RFB speaks first) is useless on its own.
"""

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Case, Count, DateTimeField, F, Max, Q, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from accounts import access
from console.models import ConsoleTicket
from drivers import registry
from drivers.base import DriverError, NoConsole
from provisioning.models import VM

KINDS = tuple(ConsoleTicket.Kind.values)
PURGE_AFTER = timedelta(days=30)  # spent tickets are the sessions' history for a while


class Refused(Exception):
    """The ticket does not open this console (the message says why; never the ticket)."""


def may_open(user, vm):
    """The VM's owner and admins (an auditor changes nothing, and a console types
    into the guest); anyone else is refused (403 on the page)."""
    owner = vm.owner_id is not None and vm.owner_id == user.pk
    return bool(user.is_authenticated and (access.is_admin(user) or owner))


def unavailable_reason(vm):
    """Why the VM's console cannot be opened now, or None (the driver may still refuse)."""
    if vm.state != VM.State.RUNNING:
        return f"the VM is {vm.state}: its console is there while it runs"
    if vm.host_id is None:
        return "the VM is on no host"
    return None


def _digest(ticket):
    return hashlib.sha256(ticket.encode()).hexdigest()


def issue(user, vm, kind):
    """A new one-time ticket for ``user`` to open ``vm``'s ``kind`` console: the clear ticket."""
    if kind not in KINDS:
        raise ValueError(f"console kind {kind!r}: one of {', '.join(KINDS)}")
    if not may_open(user, vm):
        raise Refused("only the VM's owner and staff may open its console")
    ticket = secrets.token_urlsafe(32)
    now = timezone.now()
    ConsoleTicket.objects.create(
        digest=_digest(ticket),
        user=user,
        vm=vm,
        kind=kind,
        expires=now + timedelta(seconds=settings.CONSOLE_TICKET_SECONDS),
    )
    ConsoleTicket.objects.filter(created__lt=now - PURGE_AFTER).delete()
    return ticket


def redeem(ticket, user, vm_id, kind):
    """Spend ``ticket`` for ``user`` opening VM ``vm_id``'s ``kind`` console: the ticket's row
    (its session from now on) and the VM, or ``Refused``. Spending is one conditional UPDATE,
    so of two sockets presenting the same ticket at once exactly one wins."""
    if not isinstance(ticket, str) or not ticket or len(ticket) > 200:
        raise Refused("no console ticket")
    if user is None or not user.is_authenticated:
        raise Refused("not signed in")
    now = timezone.now()
    with transaction.atomic():
        found = ConsoleTicket.objects.filter(digest=_digest(ticket)).select_related("vm").first()
        if found is None:
            raise Refused("unknown console ticket")
        if found.user_id != user.pk:
            raise Refused("this console ticket was issued to another user")
        if found.vm_id != vm_id or found.kind != kind:
            raise Refused("this console ticket is for another console")
        if found.used is not None:
            raise Refused("this console ticket was used already")
        if found.expires <= now:
            raise Refused("this console ticket expired")
        if not ConsoleTicket.objects.filter(pk=found.pk, used__isnull=True).update(used=now):
            raise Refused("this console ticket was used already")
    vm = VM.objects.select_related("host", "host__credential").get(pk=vm_id)
    if not may_open(user, vm):  # ownership may have changed since the ticket was issued
        raise Refused("only the VM's owner and staff may open its console")
    reason = unavailable_reason(vm)
    if reason:
        raise Refused(reason)
    found.used = now
    return found, vm


def closed(ticket_id):
    """The session a ticket opened has ended (its websocket closed)."""
    ConsoleTicket.objects.filter(pk=ticket_id, closed__isnull=True).update(closed=timezone.now())


def still_open(ticket_id):
    """The session's heartbeat: its socket is still open."""
    ConsoleTicket.objects.filter(pk=ticket_id, closed__isnull=True).update(seen=timezone.now())


def activity(vm_id, user_id, since, now=None):
    """``user_id``'s console sessions of VM ``vm_id``, for idle reclamation's connection tracking:
    ``{"open": how many are open, "last_closed": the latest end after since, or None}`` (one query).
    A session without a close whose heartbeat is older than three beats ended when it was last
    seen (its web process died and could not record the close)."""
    now = now or timezone.now()
    stale = now - timedelta(seconds=3 * settings.CONSOLE_HEARTBEAT_SECONDS)
    sessions = ConsoleTicket.objects.filter(vm_id=vm_id, user_id=user_id, used__isnull=False)
    sessions = sessions.annotate(alive=Coalesce("seen", "used")).annotate(
        ended=Case(
            When(closed__isnull=False, then=F("closed")),
            When(alive__lt=stale, then=F("alive")),
            default=None,
            output_field=DateTimeField(),
        ),
    )
    return sessions.aggregate(
        open=Count("pk", filter=Q(closed__isnull=True, alive__gte=stale)),
        last_closed=Max("ended", filter=Q(ended__gt=since)),
    )


def vnc_address(vm):
    """``(host, port)`` of the VM's VNC display, from its host's driver; ``NoConsole`` otherwise."""
    with registry.driver_for(vm.host) as driver:
        return driver.console_address(vm.key)


def serial_stream(vm):
    """An open serial console stream of the VM (see ``Driver.serial_console``)."""
    driver = registry.driver_for(vm.host)
    try:
        return driver.serial_console(vm.key)
    except DriverError:
        driver.close()
        raise


def console_error(exc):
    """What to tell the user when the driver cannot give the console."""
    if isinstance(exc, NoConsole):
        return str(exc)
    return f"the host did not give the console: {exc}"
