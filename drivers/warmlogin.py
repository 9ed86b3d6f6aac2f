"""What a warm guest is given when a reservation takes it (``Driver.personalise``), whatever
channel reaches it: the shell scripts run in the guest as root, and the SSH host key made on
this side. libvirt runs them through QEMU's guest agent (``libvirt/agent.py``), VMware through
guest operations (``vmware/handover.py``).
"""

import secrets

# A warm guest's new identity and its user's account, as root; every value is an argument
# ($0 hostname, $1 login, $2 "-s" to refuse passwords over SSH, else "", $3 the login's sudo
# rule, else "", $4 the new machine-id, $5 the directory of the new SSH host key), never part
# of the script. The machine-id and the host key are made on the host, not in the
# guest: a guest resumed from a snapshot resumes its random number generator too, so what it
# makes right after could repeat what it made after the same snapshot for its last user. The
# SSH server is restarted with that key (dropbear in vclmgr's test guest, OpenSSH elsewhere).
# The password hash and the keys come after (libvirt: the agent's own calls; VMware: files and
# the scripts below), so no secret is ever on a command line.
PERSONALISE = r"""
umask 022  # the agent's own umask (077) would make /etc/hosts and the machine-id unreadable to users
h=$0 u=$1 pw=$2 sudo=$3 id=$4 keys=$5
hostname "$h" && echo "$h" > /etc/hostname || exit 1
grep -v '^127\.0\.1\.1[[:space:]]' /etc/hosts > /etc/hosts.new 2>/dev/null; echo "127.0.1.1 $h" >> /etc/hosts.new
mv /etc/hosts.new /etc/hosts
rm -f /var/lib/dbus/machine-id
echo "$id" > /etc/machine-id || exit 1
if ! grep -q "^$u:" /etc/passwd; then
  if command -v useradd >/dev/null; then useradd -m -s /bin/bash "$u" || exit 2
  else  # a minimal guest (busybox without adduser): the account written as its init writes one
    n=1000; while grep -q "^[^:]*:[^:]*:$n:" /etc/passwd; do n=$((n + 1)); done
    s=/bin/bash; [ -x $s ] || s=/bin/sh
    { echo "$u:x:$n:$n::/home/$u:$s" >> /etc/passwd && echo "$u:x:$n:" >> /etc/group &&
      echo "$u:!:19000:0:99999:7:::" >> /etc/shadow && mkdir -p "/home/$u" && chown "$n:$n" "/home/$u" &&
      chmod 700 "/home/$u"; } || exit 2
  fi
fi
if [ -n "$sudo" ] && [ -d /etc/sudoers.d ]; then  # as cloud-init gives a seeded login
  echo "$u $sudo" > "/etc/sudoers.d/90-vclmgr-$u" && chmod 440 "/etc/sudoers.d/90-vclmgr-$u" || exit 5
fi
chmod 600 "$keys/dropbear" "$keys/openssh" || exit 3
if [ -f /run/dropbear.pid ]; then
  k=/etc/dropbear/dropbear_ed25519_host_key
  mv "$keys/dropbear" "$k" || exit 3
  old=$(cat /run/dropbear.pid); kill "$old"
  while kill -0 "$old" 2>/dev/null; do sleep 0.05; done
  dropbear -r "$k" -p 22 -P /run/dropbear.pid $pw || exit 4
elif [ -d /etc/ssh ]; then
  rm -f /etc/ssh/ssh_host_*_key /etc/ssh/ssh_host_*_key.pub
  mv "$keys/openssh" /etc/ssh/ssh_host_ed25519_key && mv "$keys/openssh.pub" /etc/ssh/ssh_host_ed25519_key.pub || exit 3
  systemctl restart ssh 2>/dev/null || systemctl restart sshd 2>/dev/null || service ssh restart || exit 4
fi
rm -rf "$keys"
"""
# The password hash into a guest without ``chpasswd`` (busybox), read from a root-only file the
# agent wrote ($1), never from a command line: the user's field of /etc/shadow replaced.
SET_HASH = r"""
umask 077
awk -F: -v u="$0" 'BEGIN { OFS = ":" } NR == FNR { h = $0; next } $1 == u { $2 = h } { print }' "$1" /etc/shadow \
  > /etc/shadow.new && mv /etc/shadow.new /etc/shadow; s=$?; rm -f "$1"; exit $s
"""
HASH_FILE = "/run/vclmgr-login"

# The login's SSH keys from a file ($1, written by the channel) as its only authorized keys
# ($0 the login): the account's own directory, owned by it, nothing else kept.
SET_KEYS = r"""
umask 077
u=$0 f=$1
home=$(getent passwd "$u" | cut -d: -f6); [ -n "$home" ] || home=$(grep "^$u:" /etc/passwd | cut -d: -f6)
[ -n "$home" ] || exit 6
mkdir -p "$home/.ssh" && cp "$f" "$home/.ssh/authorized_keys" && rm -f "$f" || exit 6
chown -R "$u:" "$home/.ssh" 2>/dev/null || chown -R "$u" "$home/.ssh" || exit 6
chmod 700 "$home/.ssh" && chmod 600 "$home/.ssh/authorized_keys"
"""


def identity_arguments(guest, keys_dir):
    """The arguments of ``PERSONALISE`` for ``guest`` (a ``cloudinit.GuestLogin``), its host
    key in ``keys_dir``; a new machine-id each call (made here: see ``PERSONALISE``)."""
    refuse = "" if guest.password_hash else "-s"
    return [guest.hostname, guest.login, refuse, guest.sudo or "", secrets.token_hex(16), keys_dir]


HOST_KEY_DIR = "/run/vclmgr-host-key"


def host_key():
    """A new ed25519 SSH host key in the files the guest's server reads: ``dropbear`` (dropbear's
    own format: the key type, then the private seed and the public key as one string) and
    ``openssh`` / ``openssh.pub``."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    seed = key.private_bytes(ser.Encoding.Raw, ser.PrivateFormat.Raw, ser.NoEncryption())
    public = key.public_key().public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)
    return {
        "dropbear": _ssh_string(b"ssh-ed25519") + _ssh_string(seed + public),
        "openssh": key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH, ser.NoEncryption()),
        "openssh.pub": key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH) + b"\n",
    }


def _ssh_string(data):
    return len(data).to_bytes(4, "big") + data
