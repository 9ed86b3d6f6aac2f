"""A warm VM handed to its user through vSphere's guest operations (``Driver.personalise``).

What the guest is given is libvirt's (``drivers/warmlogin.py``): a new hostname, machine-id and
SSH host key (made here, not in the resumed guest), the login's account, password hash and
authorized keys. Guest operations log in as the image's service account
(``credentials["guest"]``), so the secrets travel as files, never on a command line:

1. into ``/tmp/vclmgr-login-<random>`` (made by the first write: ``MakeDirectoryInGuest``), the
   scripts, the host key files, the password hash and the SSH keys, each written with mode
   0600 (``InitiateFileTransferToGuest`` and an HTTP PUT, as ``guest_put_file``);
2. one command through the guest command channel (``guestops``: ``StartProgramInGuest``
   under its wrapper, idempotent by tag) that runs, as root (directly, or through ``sudo -n``
   for a service account that is not root), ``PERSONALISE``, then ``SET_HASH`` and
   ``SET_KEYS``, and removes the directory whatever happened;
3. its status read back until it ends (``HANDOVER_SECONDS``); a non-zero status names the
   step the guest refused (permanent: the caller builds the VM cold).

A write or the start that fails removes the directory (``DeleteDirectoryInGuest``) before the
error goes up: a retry writes a new one, and the guest goes to its user. The command's tag
comes from the VM's key, so a retry after ``HANDOVER_SECONDS`` finds the command already
started and waits for it (writing and starting nothing) instead of running a second beside it.

A guest whose Tools offer no guest operations yet answers a temporary error at the first call.
"""

import hashlib
import logging
import secrets
import time

from drivers import warmlogin
from drivers.base import DriverError, NotFound

log = logging.getLogger(__name__)

HANDOVER_SECONDS = 60
LOGIN_DIR = "/tmp/vclmgr-login"  # + "-<random>"
# $0 the directory of the files, then PERSONALISE's arguments ($1 hostname, $2 login, ...).
AS_ROOT = r"""
d=$0
root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }
root /bin/sh -c "$(cat "$d/personalise.sh")" "$@" && {
  [ ! -f "$d/hash" ] || root /bin/sh -c "$(cat "$d/set-hash.sh")" "$2" "$d/hash"; } &&
  root /bin/sh -c "$(cat "$d/set-keys.sh")" "$2" "$d/authorized_keys"
s=$?
root rm -rf "$d"
exit $s
"""


def personalise(channel, guest):
    """Hand the running warm guest of ``channel`` (a ``guestops.GuestChannel``) to ``guest``."""
    tag = handover_tag(channel.key)
    if not started(channel, tag):
        where = f"{LOGIN_DIR}-{secrets.token_hex(8)}"
        try:
            send(channel, tag, where, guest)
        except BaseException:
            remove(channel, where)
            raise
    status = wait(channel, tag)
    if status.exit_status != 0:
        why = status.output[-300:].decode(errors="replace")
        raise DriverError(f"the guest refused its new identity (step {status.exit_status}): {why}", permanent=True)


def handover_tag(key):
    """One tag per VM (a key may be longer than a tag, and of other letters)."""
    return f"handover-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def started(channel, tag):
    try:
        channel.status(tag, 0, 1)
    except NotFound:
        return False
    return True


def send(channel, tag, where, guest):
    """The files into ``where`` and the command that uses (then removes) them started as ``tag``."""
    keys = f"{where}/keys"
    files = {f"{keys}/{name}": data for name, data in warmlogin.host_key().items()}
    files.update(
        {
            f"{where}/personalise.sh": warmlogin.PERSONALISE.encode(),
            f"{where}/set-hash.sh": warmlogin.SET_HASH.encode(),
            f"{where}/set-keys.sh": warmlogin.SET_KEYS.encode(),
            f"{where}/authorized_keys": "".join(f"{key}\n" for key in guest.ssh_keys).encode(),
        }
    )
    if guest.password_hash:
        files[f"{where}/hash"] = guest.password_hash.encode()
    for path, data in files.items():
        channel.put(path, data, mode=0o600)
    channel.start(tag, ["/bin/sh", "-c", AS_ROOT, where, *warmlogin.identity_arguments(guest, keys)], {}, "/")


def remove(channel, where):
    """``where`` gone from the guest, as far as it can be: the error that brought us here is
    the one to report (a guest refusing the write likely refuses this too)."""
    try:
        channel.remove_directory(where)
    except DriverError as exc:
        log.warning("could not remove %s from %s: %s", where, channel.key, exc)


def wait(channel, tag):
    """The ended command's ``ExecStatus``; a temporary error past ``HANDOVER_SECONDS``."""
    deadline, pause = time.monotonic() + HANDOVER_SECONDS, 0.05
    while True:
        status = channel.status(tag, 0, 1 << 16)
        if status.exited:
            return status
        if time.monotonic() > deadline:
            raise DriverError(f"the guest did not take its login within {HANDOVER_SECONDS} s", permanent=False)
        time.sleep(pause)
        pause = min(2 * pause, 0.5)
