"""What a reservation's user logs in with: the login its guest is given at the first boot
(user name, one-time password; ``fields_lacking``), and, once ready, the connection details
and the RDP file the pages and the API hand out."""

import secrets

from drivers import cloudinit
from provisioning import services as vms
from reservations.models import Reservation

S = Reservation.Status


def fields_lacking(reservation):
    """The login fields the reservation lacks: its user name (POSIX, or Windows for an RDP
    image), and a one-time password when it has no SSH key or logs in over RDP, which needs
    one (kept encrypted; a Linux VM's seed carries only its hash, a Windows one the password)."""
    values = {}
    flavour = vms.guest_flavour(reservation.image)
    if not reservation.connect_user:
        user = reservation.user.get_username() if reservation.user else "vcl"
        values["connect_user"] = cloudinit.login_name(user, flavour=flavour)
    rdp = flavour == cloudinit.CLOUDBASE_INIT
    if (rdp or not reservation.ssh_key) and not reservation.connect_secret:
        probe = Reservation(connect_secret="")
        probe.set_password(_one_time_password())
        values["connect_secret"] = probe.connect_secret
    return values


def _one_time_password():
    # Windows' default password policy wants three of upper case, lower case, digits and
    # symbols; a random token can lack them, and cloudbase-init would then fail to set it.
    while True:
        candidate = secrets.token_urlsafe(12)
        if (
            any(c.isupper() for c in candidate)
            and any(c.islower() for c in candidate)
            and any(c.isdigit() for c in candidate)
        ):
            return candidate


def connection(reservation):
    """What the user needs to log in, once ready: address, user, password or key, commands."""
    vm = reservation.vm
    if reservation.status != S.READY or vm is None:
        return None
    address = vm.address or ""
    rdp = vms.login_protocol(reservation.image) == "rdp"
    port = vm.port or vms.login_port(reservation.image)
    if rdp:
        command = f"mstsc /v:{address}" + (f":{port}" if port != 3389 else "")
    else:
        command = f"ssh {'' if port == 22 else f'-p {port} '}{reservation.connect_user}@{address}"
    return {
        "address": address,
        "port": port,
        "user": reservation.connect_user,
        "password": reservation.get_password(),
        "ssh_key": bool(reservation.ssh_key),
        "protocol": "rdp" if rdp else "ssh",
        "command": command,
    }


def rdp_file(reservation):
    details = connection(reservation)
    if details is None:
        return None
    custom = details["protocol"] == "rdp" and details["port"] != 3389
    where = details["address"] + (f":{details['port']}" if custom else "")
    return f"full address:s:{where}\r\nusername:s:{details['user']}\r\nprompt for credentials:i:1\r\n"
