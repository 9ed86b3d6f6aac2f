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

A guest whose Tools offer no guest operations yet answers a temporary error at the first call.
"""

import secrets
import time

from drivers import warmlogin
from drivers.base import DriverError

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
    where = f"{LOGIN_DIR}-{secrets.token_hex(8)}"
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
    tag = f"handover-{secrets.token_hex(6)}"
    channel.start(tag, ["/bin/sh", "-c", AS_ROOT, where, *warmlogin.identity_arguments(guest, keys)], {}, "/")
    status = wait(channel, tag)
    if status.exit_status != 0:
        why = status.output[-300:].decode(errors="replace")
        raise DriverError(f"the guest refused its new identity (step {status.exit_status}): {why}", permanent=True)


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
