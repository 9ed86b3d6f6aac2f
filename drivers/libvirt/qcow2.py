"""The backing file name in a qcow2 image's header, read and rewritten in its first cluster.

An overlay copied to another host byte for byte still names its base image by the source
host's path; ``rebased`` rewrites that name (``qemu-img rebase -u``, without qemu-img: vclmgr
reaches a host through libvirt alone) in the header's first cluster, which holds the header,
its extensions and the name (QEMU reads the name only from there: at most 1023 bytes, ending
within the first cluster). Pure functions over bytes.
"""

import struct

MAGIC = b"QFI\xfb"
HEADER = struct.Struct(">4sIQII")  # magic, version, backing_file_offset, backing_file_size, cluster_bits
NAME_MAX = 1023


class NotQcow2(ValueError):
    """Not a qcow2 header this module can read or rewrite (the reason says which)."""


def _fields(prefix):
    if len(prefix) < HEADER.size:
        raise NotQcow2(f"{len(prefix)} bytes are no qcow2 header")
    magic, version, offset, size, cluster_bits = HEADER.unpack_from(prefix)
    if magic != MAGIC or version not in (2, 3) or not 9 <= cluster_bits <= 21:
        raise NotQcow2("not a qcow2 (version 2 or 3) header")
    return offset, size, 1 << cluster_bits


def cluster_size(prefix):
    """The image's cluster size (its header lies within the first cluster)."""
    return _fields(prefix)[2]


def backing_file(prefix):
    """The backing file name of the image whose first bytes are ``prefix``, or None."""
    offset, size, _cluster = _fields(prefix)
    if not offset:
        return None
    if offset + size > len(prefix):
        raise NotQcow2("the backing file name lies past the bytes given")
    return prefix[offset : offset + size].decode()


def rebased(prefix, new_name):
    """``prefix`` (at least the name's end) with the backing file name ``new_name``, written
    where the old one was; the header's other bytes unchanged. ``NotQcow2`` when the image has
    no backing file, or the new name would not fit (the bytes after the old name must be free)."""
    offset, size, cluster = _fields(prefix)
    if not offset:
        raise NotQcow2("the image has no backing file")
    name = new_name.encode()
    end = offset + max(size, len(name))
    if len(name) > NAME_MAX or end > cluster:
        raise NotQcow2(f"a backing file name of {len(name)} bytes does not fit in its header")
    if end > len(prefix):
        raise NotQcow2("the backing file name lies past the bytes given")
    if any(prefix[offset + size : end]):
        raise NotQcow2("the bytes after its backing file name are in use")
    header = bytearray(prefix)
    header[offset:end] = name.ljust(end - offset, b"\0")
    struct.pack_into(">I", header, 16, len(name))
    return bytes(header)
