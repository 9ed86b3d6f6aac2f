"""The cloud-init NoCloud seed that delivers a reservation's login into a libvirt guest.

Contract (pure Python, no Django, no I/O):

- A guest has a flavour. ``cloud-init`` (Linux, the default) gets the password only as a hash.
  ``cloudbase-init`` (Windows, VCL's RDP case) gets the clear ``password``, because Windows
  has no way to take a crypt(3) hash; each flavour refuses the other's password field.
- ``seed_files(...)`` returns the three NoCloud files, ``meta-data``, ``user-data`` (a
  ``#cloud-config`` document) and ``network-config`` (version 2, DHCP on every ethernet NIC).
  The user-data creates exactly one login for the reservation: its name, a crypt(3) SHA-512
  password hash (never the clear password), its authorised SSH keys, and the hostname.
  For ``cloudbase-init`` the user-data is the cloud-config subset cloudbase-init's
  UserDataPlugin reads (``set_hostname``; a ``users`` entry with ``name``, ``groups``
  Administrators and Remote Desktop Users, the clear ``passwd``, ``ssh_authorized_keys``);
  its NoCloudConfigDriveService reads the same ``cidata`` volume, its VMwareGuestInfoService
  the same guestinfo keys.
- An image may bring its own cloud-config (``image_user_data``); it is merged in, but it can
  neither drop nor replace the reservation's login, nor change the keys the reservation owns
  (hostname, password authentication): such a document is refused with ``SeedError``, because
  a silently weaker merge would hand the user a machine they cannot log into.
- ``seed_iso(files)`` packs the files into an ISO 9660 image labelled ``cidata`` (Joliet and
  Rock Ridge, so the guest sees the exact names), the form cloud-init's NoCloud datasource
  reads from a CD-ROM.
- ``seed_digest(files)`` names a seed's content without revealing it (drivers compare seeds).
- ``password_hash(password)`` makes the ``$6$`` hash with libpass (the maintained fork of
  passlib), not the ``crypt`` module Python 3.13 removed.

The YAML is written in PyYAML's block style, one value per line; vclmgr's test guest
(``tools/guest-image``) parses exactly that form, as does cloud-init.
"""

import hashlib
import io
import re
from dataclasses import dataclass, field

import pycdlib
import yaml
from passlib.hash import sha512_crypt

from core import yamlsafe

LABEL = "cidata"
# A random one-time password needs no key stretching, and the guest checks the hash on every
# login, possibly under software emulation: crypt(3)'s default round count is enough.
HASH_ROUNDS = 5000

CLOUD_INIT, CLOUDBASE_INIT = "cloud-init", "cloudbase-init"
FLAVOURS = (CLOUD_INIT, CLOUDBASE_INIT)
# The groups that let a Windows user log in over RDP and administer the machine, as VCL's
# Linux users get sudo.
WINDOWS_GROUPS = ("Administrators", "Remote Desktop Users")

_LOGIN = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
# Windows logon names: at most 20 characters, none of these nor control characters, not only
# dots and spaces; the built-in accounts cannot be the reservation's login.
_WINDOWS_LOGIN = re.compile(r'^[^"/\\\[\]:;|=,+*?<>@\x00-\x1f]{1,20}$')
_WINDOWS_BUILTIN = frozenset({"administrator", "guest"})
_LOGIN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*$")
_HASH = re.compile(r"^\$6\$(rounds=\d+\$)?[./0-9A-Za-z]{1,16}\$[./0-9A-Za-z]{86}$")
# Rock Ridge and Joliet carry the real names; the ISO 9660 level-1 names are only a fallback.
_ISO_NAMES = {"meta-data": "/METADATA.;1", "user-data": "/USERDATA.;1", "network-config": "/NETWORK.;1"}


class SeedError(ValueError):
    """The guest configuration or the image's user-data cannot make a usable seed."""


@dataclass(frozen=True)
class GuestLogin:
    """What the guest must let in: one user, by key and/or by password."""

    instance_id: str
    hostname: str
    login: str
    password_hash: str | None = field(default=None, repr=False)  # a secret: never in logs or reprs
    ssh_keys: tuple[str, ...] = ()
    shell: str = "/bin/bash"
    sudo: str | None = "ALL=(ALL) NOPASSWD:ALL"
    image_user_data: str | None = field(default=None, repr=False)
    flavour: str = CLOUD_INIT
    password: str | None = field(default=None, repr=False)  # cloudbase-init only: Windows takes no hash

    def __post_init__(self):
        if self.flavour not in FLAVOURS:
            raise SeedError(f"flavour {self.flavour!r}: must be one of {', '.join(FLAVOURS)}")
        if self.anonymous:  # the guest's identity alone (a warm VM's): no one's login in it
            pass
        elif self.windows:
            self._check_windows()
        else:
            self._check_linux()
        if not _HOSTNAME.match(self.hostname):
            raise SeedError(f"hostname {self.hostname!r}: not a valid host name")
        # A key read from a .pub file keeps its newline; anything more is not one key.
        object.__setattr__(self, "ssh_keys", tuple(key.strip() for key in self.ssh_keys))
        for key in self.ssh_keys:
            if not key or "\n" in key or "\r" in key:
                raise SeedError("ssh_keys: each key must be one non-empty line")
        if not self.anonymous and not self.password_hash and not self.password and not self.ssh_keys:
            raise SeedError("the login needs a password or at least one SSH key")
        if not self.instance_id or "\n" in self.instance_id:
            raise SeedError("instance_id: must be one non-empty line")

    @property
    def anonymous(self):
        """A seed of the guest's identity alone: no login, no password, no key (a warm VM's)."""
        return not self.login and not self.password_hash and not self.password and not self.ssh_keys

    @property
    def windows(self):
        return self.flavour == CLOUDBASE_INIT

    def _check_linux(self):
        if not _LOGIN.fullmatch(self.login) or self.login == "root":
            raise SeedError(f"login {self.login!r}: must be a lower-case POSIX user name, not root")
        if self.password is not None:
            raise SeedError("password: a clear password is only for cloudbase-init guests; cloud-init gets the hash")
        if self.password_hash is not None and not _HASH.match(self.password_hash):
            raise SeedError("password_hash: must be a crypt(3) SHA-512 hash ($6$…), never a clear password")

    def _check_windows(self):
        name = self.login
        if not _WINDOWS_LOGIN.fullmatch(name) or not name.strip(". ") or name.lower() in _WINDOWS_BUILTIN:
            raise SeedError(
                f"login {name!r}: must be a Windows user name (at most 20 characters, none of "
                '"/\\[]:;|=,+*?<>@), not a built-in account'
            )
        if self.password_hash is not None:
            raise SeedError("password_hash: Windows cannot take a hash; a cloudbase-init guest gets the password")
        if self.password is not None and (not self.password or any(ord(c) < 32 for c in self.password)):
            raise SeedError("password: must be non-empty, without control characters")


def login_name(name, fallback="vcl", flavour=CLOUD_INIT):
    """A POSIX user name for ``name`` (a vclmgr username): lower-case ASCII letters, digits,
    '_' and '-', starting with a letter or '_', at most 32; ``fallback`` when nothing is left
    or the name is root. The reservation page shows the same name the guest is given.
    For ``cloudbase-init`` the same characters (valid on Windows too), at most 20, and not a
    built-in Windows account."""
    limit, reserved = (20, _WINDOWS_BUILTIN) if flavour == CLOUDBASE_INIT else (32, {"root"})
    cleaned = "".join(c if c in _LOGIN_CHARS else "_" for c in name.lower())[:limit]
    if cleaned and not (cleaned[0].isalpha() or cleaned[0] == "_"):
        cleaned = ("u" + cleaned)[:limit]
    if not cleaned.strip("_") or cleaned in reserved:
        return fallback
    return cleaned


def password_hash(password, rounds=HASH_ROUNDS):
    return sha512_crypt.using(rounds=rounds).hash(password)


def meta_data(guest):
    return _dump({"instance-id": guest.instance_id, "local-hostname": guest.hostname})


def network_config():
    return _dump({"version": 2, "ethernets": {"nics": {"match": {"name": "e*"}, "dhcp4": True}}})


def user_data(guest):
    doc = _windows_config(guest) if guest.windows else _linux_config(guest)
    image = _image_config(guest.image_user_data)
    _refuse_login_changes(image, doc, guest)
    for key, value in image.items():
        if key == "users":
            doc["users"] += value
        elif key not in doc:
            doc[key] = value
    return "#cloud-config\n" + _dump(doc)


def _linux_config(guest):
    if guest.anonymous:  # no users at all (an empty list: not even the image's default user)
        return {"hostname": guest.hostname, "users": [], "ssh_pwauth": False}
    user = {"name": guest.login, "lock_passwd": guest.password_hash is None}
    if guest.password_hash:
        user["passwd"] = guest.password_hash
    if guest.ssh_keys:
        user["ssh_authorized_keys"] = list(guest.ssh_keys)
    user["shell"] = guest.shell
    if guest.sudo:
        user["sudo"] = guest.sudo
    return {"hostname": guest.hostname, "users": [user], "ssh_pwauth": guest.password_hash is not None}


def _windows_config(guest):
    # cloudbase-init's dialect: no sudo, shell, lock_passwd or ssh_pwauth (it has none), and
    # without a passwd it sets a random one, which suits a key-only login.
    if guest.anonymous:
        return {"set_hostname": guest.hostname, "users": []}
    user = {"name": guest.login, "groups": list(WINDOWS_GROUPS)}
    if guest.password:
        user["passwd"] = guest.password
    if guest.ssh_keys:
        user["ssh_authorized_keys"] = list(guest.ssh_keys)
    return {"set_hostname": guest.hostname, "users": [user]}


def seed_files(guest):
    return {
        "meta-data": meta_data(guest).encode(),
        "user-data": user_data(guest).encode(),
        "network-config": network_config().encode(),
    }


def seed_digest(files):
    """Names a seed's content (to tell two seeds apart) without revealing it."""
    body = b"".join(hashlib.sha256(files[name]).digest() for name in sorted(files))
    return hashlib.sha256(body).hexdigest()[:32]


def seed_iso(files):
    """ISO 9660 bytes labelled ``cidata`` holding ``files`` (name → bytes) at its root."""
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=1, joliet=3, rock_ridge="1.09", vol_ident=LABEL)
    for name, data in files.items():
        if name not in _ISO_NAMES:
            raise SeedError(f"{name!r} is not a NoCloud seed file")
        iso.add_fp(io.BytesIO(data), len(data), _ISO_NAMES[name], rr_name=name, joliet_path=f"/{name}")
    out = io.BytesIO()
    iso.write_fp(out)
    iso.close()
    return out.getvalue()


def _dump(doc):
    # Block style, no line wrapping: one value per line (see the module docstring).
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=1 << 20)


def image_config_error(text):
    """Why an image's own cloud-config cannot be merged into a seed (for its form), or None."""
    try:
        _image_config(text)
    except SeedError as exc:
        return str(exc).removeprefix("image user-data: ")
    return None


def _image_config(text):
    if not text or not text.strip():
        return {}
    if not text.lstrip().startswith("#cloud-config"):
        raise SeedError("image user-data: only a #cloud-config document can be merged")
    try:
        doc = yamlsafe.load(text)
    except yamlsafe.AliasError as exc:
        raise SeedError(f"image user-data: {exc}; aliases are not accepted: write the value out") from None
    except yaml.YAMLError as exc:
        raise SeedError(f"image user-data: not YAML: {exc}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise SeedError("image user-data: the cloud-config must be a mapping")
    if "users" in doc and not isinstance(doc["users"], list):
        raise SeedError("image user-data: users must be a list (a string or mapping would replace the login)")
    return doc


def _refuse_login_changes(image, doc, guest):
    login = guest.login
    # Windows user names are case-insensitive: ALICE would be the same account as alice.
    same = (lambda name: str(name).lower() == login.lower()) if guest.windows else (lambda name: name == login)
    for key in ("set_hostname",) if guest.windows else ("hostname", "ssh_pwauth"):
        if key in image and image[key] != doc[key]:
            raise SeedError(f"image user-data: {key} is set by the reservation and cannot be changed")
    if "fqdn" in image and not str(image["fqdn"]).startswith(guest.hostname + "."):
        raise SeedError("image user-data: fqdn must start with the reservation's hostname")
    for entry in image.get("users", []):
        name = entry.get("name") if isinstance(entry, dict) else entry
        if same(name):
            raise SeedError(f"image user-data: users may not redefine the reservation's login {login!r}")
    default_user = image.get("user")
    if default_user is not None:
        name = default_user.get("name") if isinstance(default_user, dict) else default_user
        if same(name):
            raise SeedError(f"image user-data: user may not redefine the reservation's login {login!r}")
    if "chpasswd" in image and any(same(name) for name in _names_in_chpasswd(image["chpasswd"])):
        raise SeedError(f"image user-data: chpasswd may not change the password of {login!r}")


def _names_in_chpasswd(chpasswd):
    if not isinstance(chpasswd, dict):
        return set()
    names = {u.get("name") for u in chpasswd.get("users", []) if isinstance(u, dict)}
    legacy = chpasswd.get("list", [])
    lines = legacy.splitlines() if isinstance(legacy, str) else legacy
    names |= {str(line).split(":", 1)[0] for line in lines}
    return names
