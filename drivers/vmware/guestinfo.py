"""The guest's first-boot configuration as VMware guestinfo, for cloud-init's VMware datasource.

Contract (pure Python: no pyVmomi, no Django, no I/O):

- ``values(guest)`` returns the extraConfig entries that carry ``guest`` (a
  ``cloudinit.GuestLogin``) into the VM:

  ==============================  ===============  =====================================
  key                             value            content
  ==============================  ===============  =====================================
  ``guestinfo.metadata``          base64           JSON: ``instance-id``, ``local-hostname``,
                                                   ``network`` (the network-config v2 YAML,
                                                   itself base64, ``network.encoding``),
                                                   ``redact: [userdata]``
  ``guestinfo.metadata.encoding`` ``base64``
  ``guestinfo.userdata``          gzip+base64      the ``#cloud-config`` of ``cloudinit``
  ``guestinfo.userdata.encoding`` ``gzip+base64``
  ``vclmgr.seed``                 hex digest       identifies the seed (idempotent reseed)
  ==============================  ===============  =====================================

  The documents are ``cloudinit``'s, so a VMware guest gets exactly the login a libvirt guest
  gets from its NoCloud seed. cloudbase-init's ``VMwareGuestInfoService`` reads the same keys
  and encodings. ``redact`` asks cloud-init to overwrite ``guestinfo.userdata`` once read, so
  processes in the guest (which can all read guestinfo) cannot fetch the password hash later.
- ``cleared()``: the same keys with empty values; vSphere deletes an extraConfig key set to "".
- The encoding is deterministic (gzip without a timestamp): the same guest gives the same
  values, so a retried reseed finds nothing to change.
- ``instance_id(extra)`` and ``seed_of(extra)`` read a VM's current extraConfig (key → value);
  nothing here returns or logs the user-data or the hash.
"""

import base64
import gzip
import hashlib
import json

from drivers import cloudinit

METADATA, USERDATA = "guestinfo.metadata", "guestinfo.userdata"
DIGEST = "vclmgr.seed"
ENCODINGS = {METADATA: "base64", USERDATA: "gzip+base64"}
KEYS = (METADATA, f"{METADATA}.encoding", USERDATA, f"{USERDATA}.encoding", DIGEST)


def values(guest):
    """extraConfig key → value delivering ``guest``; raises ``cloudinit.SeedError``."""
    files = cloudinit.seed_files(guest)
    meta = {
        "instance-id": guest.instance_id,
        "local-hostname": guest.hostname,
        "network": encode(files["network-config"], "base64"),
        "network.encoding": "base64",
        "redact": ["userdata"],
    }
    out = {
        METADATA: encode(json.dumps(meta, sort_keys=True).encode(), ENCODINGS[METADATA]),
        f"{METADATA}.encoding": ENCODINGS[METADATA],
        USERDATA: encode(files["user-data"], ENCODINGS[USERDATA]),
        f"{USERDATA}.encoding": ENCODINGS[USERDATA],
    }
    body = json.dumps({k: out[k] for k in (METADATA, USERDATA)}, sort_keys=True).encode()
    out[DIGEST] = hashlib.sha256(body).hexdigest()[:32]
    return out


def cleared():
    return dict.fromkeys(KEYS, "")


def is_seed_key(key):
    return key in KEYS


def encode(data, encoding):
    if encoding == "gzip+base64":
        data = gzip.compress(data, mtime=0)
    elif encoding != "base64":
        raise ValueError(f"unknown guestinfo encoding {encoding!r}")
    return base64.b64encode(data).decode("ascii")


def decode(value, encoding):
    """The bytes a guestinfo value carries (what cloud-init's VMware datasource decodes)."""
    if encoding in ("gzip+base64", "gz+b64"):
        return gzip.decompress(base64.b64decode(value))
    if encoding in ("base64", "b64"):
        return base64.b64decode(value)
    return value.encode()


def metadata_of(extra):
    """The decoded metadata mapping in a VM's extraConfig, or None when it carries no seed."""
    value = extra.get(METADATA) or ""
    if not value.strip() or value.strip() == "---":
        return None
    try:
        doc = json.loads(decode(value, extra.get(f"{METADATA}.encoding", "").strip()))
    except ValueError:
        return None  # not ours (hand-written YAML, say): no instance-id to compare with
    return doc if isinstance(doc, dict) else None


def instance_id(extra):
    meta = metadata_of(extra)
    return None if meta is None else meta.get("instance-id")


def seed_of(extra):
    """The seed's digest in a VM's extraConfig ("" when it has none)."""
    return extra.get(DIGEST, "")
