"""The backing file name in a qcow2 header, rewritten for an overlay moved to another host's
pool (``drivers/libvirt/qcow2.py``): checked with qemu-img itself, and the headers
it refuses to touch."""

import struct
import subprocess

import pytest

from drivers.libvirt import qcow2


def header(backing=b"/pool-a/base.qcow2", offset=None, cluster_bits=16, tail=b""):
    """A minimal version 3 header (104 bytes) and its backing file name, in one cluster."""
    offset = offset if offset is not None else (112 if backing else 0)
    fields = qcow2.HEADER.pack(qcow2.MAGIC, 3, offset, len(backing), cluster_bits)
    data = bytearray(fields.ljust(104, b"\0").ljust(1 << cluster_bits, b"\0"))
    if backing:
        data[offset : offset + len(backing)] = backing
        data[offset + len(backing) : offset + len(backing) + len(tail)] = tail
    return bytes(data)


def test_the_name_is_read_and_rewritten_in_place_longer_or_shorter():
    old = header()
    assert qcow2.backing_file(old) == "/pool-a/base.qcow2" and qcow2.cluster_size(old) == 65536
    longer = qcow2.rebased(old, "/var/lib/libvirt/images/pool-b/base.qcow2")
    assert qcow2.backing_file(longer) == "/var/lib/libvirt/images/pool-b/base.qcow2"
    shorter = qcow2.rebased(longer, "/b/base.qcow2")
    assert qcow2.backing_file(shorter) == "/b/base.qcow2"
    assert shorter[112 + 13 :] == bytes(len(shorter) - 125)  # the old name's rest zeroed
    assert shorter[:8] == old[:8] and shorter[20:112] == old[20:112]  # the rest of the header as it was


def test_it_refuses_what_it_cannot_rewrite_safely():
    with pytest.raises(qcow2.NotQcow2, match="not a qcow2"):
        qcow2.backing_file(b"\0" * 512)
    with pytest.raises(qcow2.NotQcow2, match="no backing file"):
        qcow2.rebased(header(backing=b""), "/b/base.qcow2")
    with pytest.raises(qcow2.NotQcow2, match="in use"):
        qcow2.rebased(header(tail=b"\x01"), "/a/much/longer/path/to/base.qcow2")
    with pytest.raises(qcow2.NotQcow2, match="does not fit"):
        qcow2.rebased(header(offset=65536 - 40, backing=b"/pool-a/base.qcow2"), "/b/" + "x" * 40)
    with pytest.raises(qcow2.NotQcow2, match="does not fit"):
        qcow2.rebased(header(), "/" + "x" * 1024)
    assert qcow2.backing_file(header(backing=b"")) is None


def test_qemu_img_reads_the_rewritten_overlay(tmp_path):
    for name in ("base-a.qcow2", "other-base-with-a-longer-name.qcow2"):
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(tmp_path / name), "64M"], check=True)
    overlay = tmp_path / "vcl-1.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(tmp_path / "base-a.qcow2"), str(overlay)],
        check=True,
    )
    data = overlay.read_bytes()
    first = qcow2.cluster_size(data)
    new = str(tmp_path / "other-base-with-a-longer-name.qcow2")
    overlay.write_bytes(qcow2.rebased(data[:first], new) + data[first:])

    info = subprocess.run(["qemu-img", "info", "--output=json", str(overlay)], check=True, capture_output=True)
    assert f'"backing-filename": "{new}"' in info.stdout.decode()
    subprocess.run(["qemu-img", "check", "-q", str(overlay)], check=True)
    assert struct.unpack_from(">I", overlay.read_bytes(), 16)[0] == len(new)
