"""The guest side of a VM: the login its first boot is given, and whether it answers.

- ``guest_login(vm)``: the ``GuestLogin`` for ``VMSpec.guest``. A reservation's VM gets the
  reservation's login (the name its page shows, its SSH key, the hash of its one-time
  password, which is made here from the encrypted clear one and never stored); an image may
  add its own cloud-config (``Image.user_data``). The instance id is fresh for every seed, so
  cloud-init applies each seed once. A VM asked for directly gets its owner's login with the
  SSH key its request gave; without a key, None (the image's own login). A warm pool's VM
  gets a seed of its hostname alone, no login (``provisioning.warm``). A Windows image
  (``services.guest_flavour``) gets the cloudbase-init flavour, and with it the clear
  one-time password, since Windows cannot take a hash; no other image ever gets it.
- ``channel_driver(vm)``: the driver of the VM's host with its image's guest login (VMware's
  guest operations log in as the vmware variant's service account; other drivers ignore it).
- ``wait_answer(...)``: "ready means reachable". A VM is ready when its login service
  answers at its address and port with a real greeting (an ``SSH-`` banner; for RDP, an
  X.224 connection confirm), because QEMU user-mode networking accepts a TCP connection
  itself before the guest is up, so a bare connect proves nothing. An image with
  ``readiness = agent`` is ready when its guest agent answers a ping instead (a guest with no
  login service reachable from the workers). Either way a VM that stops meanwhile (its QEMU
  killed, a crash) fails at once rather than at the timeout. A probe sent before the guest's
  network is up gets no reply at all (QEMU's forward holds the connection, a bridge's ARP goes
  unanswered) and waits out its timeout even if the guest comes up meanwhile: so probes are
  short while the wait is young, and grow more patient as it ages (a guest slow to boot, on a
  loaded host, is slow to greet too).
"""

import secrets
import socket
import time

from django.contrib.auth import get_user_model
from django.db.models import OuterRef, Subquery
from django.db.models.functions import JSONObject

from drivers import base, cloudinit
from drivers import registry as drivers
from inventory import crypto
from provisioning import services
from provisioning.models import VM

PROBE_FIRST, PROBE_PATIENCE = 0.25, 2.0
STATE_EVERY = 1.0  # seconds between checks that the VM still runs (a call to its host)
# A guest agent's answer is a call to its host (on VMware a vCenter property read), made for
# every VM booting at once (a class's seats at the bell): slower than a socket probe.
AGENT_POLL = 0.5
# An X.224 Connection Request (TPKT header + CR TPDU, RDP negotiation request for TLS).
_RDP_HELLO = bytes.fromhex("030000130ee000000000000100080003000000")


def reservation_login(vm=None):
    """The login of a VM's latest reservation as one value (a JSON object; None without one):
    an expression for ``common.load_vm`` to read with the VM (``vm`` None), or read now."""
    rows = VM.reservations.rel.related_model.objects.order_by("-pk")
    login = JSONObject(
        encrypted="connect_secret", key="ssh_key", login="connect_user", user=f"user__{get_user_model().USERNAME_FIELD}"
    )
    if vm is None:
        return Subquery(rows.filter(vm=OuterRef("pk")).annotate(login=login).values("login")[:1])
    return rows.filter(vm=vm).annotate(login=login).values_list("login", flat=True).first()


def guest_login(vm):
    flavour = services.guest_flavour(vm.image)
    # Read with the VM by its build (``load_vm(building=True)``), else now.
    reservation = vm.reservation_login if hasattr(vm, "reservation_login") else reservation_login(vm)
    if reservation is not None:
        password = crypto.decrypt(reservation["encrypted"]) if reservation["encrypted"] else ""
        key = reservation["key"]
        login = reservation["login"] or cloudinit.login_name(reservation["user"], flavour=flavour)
    elif vm.owner is not None:  # a VM asked for directly: its owner, by the key the request gave
        password, key = "", vm.ssh_key
        login = cloudinit.login_name(vm.owner.get_username(), flavour=flavour)
    elif vm.warm == VM.Warm.WARM:  # a warm pool's VM: its identity alone (a guest with no seed waits for one)
        return cloudinit.GuestLogin(
            instance_id=f"{vm.key}-{secrets.token_hex(8)}",
            hostname=vm.hostname or vm.key,
            login="",
            image_user_data=vm.image.user_data or None,
            flavour=flavour,
        )
    else:
        return None
    keys = tuple(line for line in key.splitlines() if line.strip())
    if not password and not keys:
        return None
    windows = flavour == cloudinit.CLOUDBASE_INIT
    return cloudinit.GuestLogin(
        instance_id=f"{vm.key}-{secrets.token_hex(8)}",
        hostname=vm.hostname or vm.key,
        login=login,
        password_hash=cloudinit.password_hash(password) if password and not windows else None,
        password=password if password and windows else None,
        ssh_keys=keys,
        image_user_data=vm.image.user_data or None,
        flavour=flavour,
    )


def answers(address, port, protocol, timeout=2.0):
    """True when a login service greets us at ``address:port``."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            if protocol == "rdp":
                conn.sendall(_RDP_HELLO)
                return conn.recv(4)[:1] == b"\x03"
            return conn.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def probe_timeout(waited):
    """How long one probe waits for a greeting after ``waited`` seconds of waiting: 0.25 s at
    first, 2 s after 35 s."""
    return min(PROBE_PATIENCE, PROBE_FIRST + waited / 20)


def wait_answer(vm, address, driver, poll=0.1):
    """Until the VM's login service (or guest agent) answers, probed every ``poll`` seconds (an
    agent no more often than every ``AGENT_POLL``); a temporary DriverError after the image's
    timeout, or within ``STATE_EVERY`` seconds of the VM no longer running."""
    protocol, guest_port = services.login_protocol(vm.image), services.login_port(vm.image)
    port = vm.port or guest_port
    timeout = vm.image.ready_timeout
    started = time.monotonic()
    if vm.image.readiness == vm.image.Readiness.AGENT:
        answered, silence = (lambda: driver.agent_answers(vm.key)), f"guest agent did not answer within {timeout} s"
        poll = max(poll, AGENT_POLL)
    else:
        answered = lambda: answers(address, port, protocol, probe_timeout(time.monotonic() - started))  # noqa: E731
        silence = f"guest did not answer on port {guest_port} within {timeout} s"
    deadline, checked = started + timeout, None
    while not answered():
        now = time.monotonic()
        if checked is None or now - checked >= STATE_EVERY:
            check_running(vm, driver)
            checked = now
        if now > deadline:
            raise base.DriverError(silence, permanent=False)
        time.sleep(poll)


def check_running(vm, driver):
    """A VM that stopped while booting will never answer: say so now (the retry path follows)."""
    state = driver.state(vm.key)
    if state != base.VMState.RUNNING:
        raise base.DriverError(f"{vm.key} stopped while booting (it is {state})", permanent=False)


def channel_driver(vm):
    """``vm``'s host's driver with the guest login of the VM's image variant (see above)."""
    variant = (
        vm.variant
        or vm.image.variants.filter(revision_id=vm.revision_id, hypervisor_type=vm.host.hypervisor_type).first()
    )
    return drivers.driver_for(vm.host, guest=variant.guest_login() if variant else None)
