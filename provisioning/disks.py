"""Checking and converting a disk image a user uploaded (qcow2, raw, or an OVA's vmdk).

``inspect`` either returns what the file is (``DiskInfo``) or raises ``DiskRefused`` with a
reason the uploader can act on; ``inspect_ova`` does the same for an OVA, extracting its disks
into a private folder; ``convert`` writes another format atomically. No models, no views.

The file's format is never guessed by qemu-img. Probing is how a raw disk whose guest wrote
a qcow2 header into its first sector becomes "a qcow2 with a backing file /etc/shadow". So:

- a declared format is used as declared: a raw upload is read as raw whatever its first bytes
  say (``DiskInfo.looks_like`` reports what they look like, for a hint);
- without a declaration the format is decided here from the magic bytes (no magic: raw), then
  read with that format forced;
- every qemu-img call names its driver in a ``json:`` filename with ``"backing": null`` (a
  backing file is never opened, even by ``qemu-img check``, which otherwise opens it) and an
  absolute path (no ``proto:`` prefix can be read into it), under ``prlimit`` and a timeout;
- a qcow2's header is read here first: a backing file, an external data file or encryption is
  refused before qemu-img opens it, and refused again if ``qemu-img info`` reports it.

Refused: formats other than qcow2 and raw (vmdk only inside an OVA, and only as one
self-contained file: streamOptimized or monolithicSparse), a file that is not what it is
declared to be, a backing file of any kind (a path, a URL, a ``json:`` filename), a qcow2
external data file, encryption, a virtual or file size over the limits, and a qcow2 or vmdk
that ``qemu-img check`` finds corrupt (a truncated upload). Leaked clusters are harmless and
accepted.

An OVA is read with ``tarfile`` and checked before anything is extracted: only regular files
with plain names (no folder, no absolute path, no ``..``, no link, device or sparse member), at
most ``max_members`` of them, each within the file size limit, names unique; exactly one
``.ovf``, parsed with defusedxml (no DTD, hence no entity expansion); every file it references
present; the descriptor and the disks match the manifest (``.mf``) if there is one. Only the
disks are extracted (streamed, with tarfile's ``data`` filter as well) into a fresh 0700 folder
under ``workdir``, and checked as vmdk; on any refusal that folder is removed.
"""

import hashlib
import json
import math
import os
import re
import shutil
import struct
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from xml.etree.ElementTree import ParseError

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import fromstring as parse_xml

UPLOAD_FORMATS = ("qcow2", "raw")
VMDK_TYPES = ("streamOptimized", "monolithicSparse")  # one file, its descriptor inside
INFO_SECONDS = 30  # qemu-img info reads the header and metadata only
CHECK_SECONDS = 600  # qemu-img check reads every metadata table of the image
MEMORY_BYTES = 1 << 30  # address space of a qemu-img reading an untrusted image
MAX_OVA_MEMBERS = 32
MAX_OVF_BYTES = 1 << 20

GIB = 1 << 30


class DiskError(Exception):
    """A disk operation failed for a reason that is not the file's (a full disk, no qemu-img)."""


class DiskRefused(DiskError):
    """The file is not acceptable; ``reason`` says why and what to do, for the uploader."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class DiskInfo:
    format: str  # the format the file was read as (and must be used as)
    virtual_size: int  # bytes the guest sees
    file_size: int  # bytes of the file
    looks_like: str | None = None  # the format its first bytes suggest (None: no known magic)
    subformat: str | None = None  # vmdk: its create type


@dataclass(frozen=True)
class OvaDisk:
    name: str  # the member's name in the archive
    path: Path  # where it was extracted
    info: DiskInfo


@dataclass(frozen=True)
class OvaInfo:
    directory: Path  # the private folder holding the extracted disks; the caller removes it
    ovf_name: str
    disks: tuple[OvaDisk, ...]

    def remove(self):
        shutil.rmtree(self.directory, ignore_errors=True)


def upload_limits():
    """The size limits from settings, as ``inspect``'s and ``inspect_ova``'s keywords."""
    from django.conf import settings

    return {
        "max_virtual_bytes": settings.IMAGE_UPLOAD_MAX_VIRTUAL_GIB * GIB,
        "max_file_bytes": settings.IMAGE_UPLOAD_MAX_FILE_GIB * GIB,
    }


# --- the file's own bytes -------------------------------------------------------------------

# (offset, magic, format); a qcow2 magic with version 1 is the old qcow, told apart below.
_MAGICS = (
    (0, b"QFI\xfb", "qcow2"),
    (0, b"KDMV", "vmdk"),
    (0, b"# Disk DescriptorFile", "vmdk"),
    (0, b"COWD", "vmdk"),
    (0, b"conectix", "vpc"),
    (0, b"vhdxfile", "vhdx"),
    (0x40, b"\x7f\x10\xda\xbe", "vdi"),
    (0, b"QED\x00", "qed"),
    (0, b"LUKS\xba\xbe", "luks"),
    (0, b"WithoutFreeSpace", "parallels"),
    (0, b"WithouFreSpacExt", "parallels"),
    (0, b"\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01", "cloop"),
)
# A vmdk must be one sparse file (KDMV): a text descriptor names its extents by host paths.
_SELF_CONTAINED = {"qcow2": b"QFI\xfb", "vmdk": b"KDMV"}
# magic, version, backing_file_offset, backing_file_size, cluster_bits, size, crypt_method
_QCOW2 = struct.Struct(">4sIQIIQI")
_QCOW2_INCOMPAT = struct.Struct(">Q")  # at offset 72, version 3
_DATA_FILE_BIT = 1 << 2


def _head(path, size=4096):
    with open(path, "rb") as handle:
        return handle.read(size)


def looks_like(head):
    """The format ``head`` (a file's first bytes) carries the magic of, or None."""
    for offset, magic, name in _MAGICS:
        if head[offset : offset + len(magic)] == magic:
            if name == "qcow2" and len(head) >= 8 and struct.unpack(">I", head[4:8])[0] == 1:
                return "qcow"
            return name
    return None


def _check_qcow2_header(head):
    if len(head) < _QCOW2.size:
        raise DiskRefused("the file is too short to be a qcow2 image: the upload may have been cut short")
    _magic, version, backing_offset, backing_size, _bits, _size, crypt = _QCOW2.unpack_from(head)
    if backing_offset:
        name = head[backing_offset : backing_offset + min(backing_size, 1023)].decode(errors="replace")
        raise _backing_refused(name or "a name past the first 4 KiB")
    if crypt:
        raise _encrypted()
    if version >= 3 and len(head) >= 80:
        (incompatible,) = _QCOW2_INCOMPAT.unpack_from(head, 72)
        if incompatible & _DATA_FILE_BIT:
            raise _data_file_refused(None)


def _check_magic(fmt, seen, head):
    if seen != fmt:
        raise DiskRefused(f"the file is not a {fmt} image (its first bytes look like {seen or 'raw data'})")
    if not head.startswith(_SELF_CONTAINED[fmt]):
        raise DiskRefused("the vmdk disk is a descriptor naming other files; export it as one streamOptimized file")
    if fmt == "qcow2":
        _check_qcow2_header(head)


def _backing_refused(name):
    return DiskRefused(
        f"the image has a backing file ({name}); upload a standalone image "
        "(qemu-img convert -O qcow2 overlay.qcow2 standalone.qcow2 merges the chain)"
    )


def _data_file_refused(name):
    where = f" ({name})" if name else ""
    return DiskRefused(
        f"the image keeps its data in an external data file{where}; upload a standalone image "
        "(qemu-img convert -O qcow2 image.qcow2 standalone.qcow2)"
    )


def _encrypted():
    return DiskRefused("the image is encrypted; upload it unencrypted")


# --- qemu-img -------------------------------------------------------------------------------


def _spec(path, fmt):
    """A ``json:`` filename: the driver forced, no backing file, the path taken literally."""
    spec = {"driver": fmt, "file": {"driver": "file", "filename": str(path)}}
    if fmt != "raw":
        spec["backing"] = None
    return "json:" + json.dumps(spec, separators=(",", ":"))


def _qemu_img(args, *, timeout, limited=True, hide=()):
    """Run qemu-img: (returncode, stdout, the last line of stderr with ``hide`` blanked out)."""
    command = ["qemu-img", *args]
    if limited:
        command = ["prlimit", f"--as={MEMORY_BYTES}", f"--cpu={math.ceil(timeout)}", "--", *command]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise DiskError(f"{exc.filename} is not installed") from None
    stderr = done.stderr.strip()
    for text in hide:
        stderr = stderr.replace(text, "the file")
    return done.returncode, done.stdout, stderr.splitlines()[-1].removeprefix("qemu-img: ") if stderr else ""


def _read(verb, path, fmt, seconds):
    """``qemu-img <verb> --output=json`` on the untrusted image; a refusal if it takes too long."""
    spec = _spec(path, fmt)
    try:
        return _qemu_img([verb, "--output=json", spec], timeout=seconds, hide=(spec, str(path)))
    except subprocess.TimeoutExpired:
        doing = "read" if verb == "info" else verb
        raise DiskRefused(f"qemu-img could not {doing} the {fmt} image within {seconds} s") from None


def _info(path, fmt):
    code, out, err = _read("info", path, fmt, INFO_SECONDS)
    if code != 0:
        raise DiskRefused(f"the file is not a readable {fmt} image ({err})")
    return json.loads(out)


def _check(path, fmt):
    code, out, err = _read("check", path, fmt, CHECK_SECONDS)
    # 0: clean, 3: only leaked clusters (space lost, data intact), 63: no check for this format.
    if code in (0, 3, 63):
        return
    try:
        report = json.loads(out)
    except ValueError:
        report = {}
    found = report.get("corruptions", 0) + report.get("check-errors", 0)
    detail = f"qemu-img check found {found} errors" if found else (err or f"qemu-img check failed ({code})")
    raise DiskRefused(f"the {fmt} image is corrupt or truncated ({detail}); upload it again")


# --- inspect ----------------------------------------------------------------------------------


def inspect(path, *, declared_format=None, max_virtual_bytes, max_file_bytes):
    """What the uploaded disk at ``path`` is, or ``DiskRefused``. See the module docstring."""
    if declared_format == "vmdk":
        raise DiskRefused("a vmdk disk is accepted only inside an OVA; upload the .ova, or convert it to qcow2")
    if declared_format is not None and declared_format not in UPLOAD_FORMATS:
        raise DiskRefused(f"format {declared_format} is not accepted; upload qcow2 or raw")
    return _inspect(path, declared_format, UPLOAD_FORMATS, max_virtual_bytes, max_file_bytes)


def _inspect(path, declared, allowed, max_virtual_bytes, max_file_bytes):
    path = Path(os.path.abspath(path))
    file_size = _regular_size(path)
    if file_size > max_file_bytes:
        raise DiskRefused(f"the file is {_size(file_size)}, over the limit of {_size(max_file_bytes)}")
    head = _head(path)
    seen = looks_like(head)
    fmt = declared or seen or "raw"
    if fmt not in allowed:
        raise DiskRefused(
            f"{fmt} images are not accepted; upload {' or '.join(allowed)} "
            f"(qemu-img convert -O qcow2 disk.{fmt} disk.qcow2 converts it)"
        )
    if fmt != "raw":
        _check_magic(fmt, seen, head)
    info = _info(path, fmt)
    subformat = _refuse_by_info(info, fmt, path)
    virtual = int(info.get("virtual-size", 0))
    if virtual > max_virtual_bytes:
        raise DiskRefused(
            f"the virtual size {_size(virtual)} is over the limit of {_size(max_virtual_bytes)}; "
            "shrink the disk before uploading"
        )
    if fmt != "raw":
        _check(path, fmt)
    return DiskInfo(format=fmt, virtual_size=virtual, file_size=file_size, looks_like=seen, subformat=subformat)


def _regular_size(path):
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise DiskRefused("the file is missing: upload it again") from None
    if not (st.st_mode & 0o170000 == 0o100000):
        raise DiskRefused("the upload is not a regular file")
    return st.st_size


def _refuse_by_info(info, fmt, path):
    """Refuse what ``qemu-img info`` reports; the vmdk create type (else None)."""
    if info.get("format") != fmt:
        raise DiskRefused(f"the file is not a {fmt} image (qemu-img reads it as {info.get('format')})")
    backing = info.get("backing-filename") or info.get("full-backing-filename")
    if backing:
        raise _backing_refused(backing)
    if info.get("encrypted"):
        raise _encrypted()
    specific = (info.get("format-specific") or {}).get("data") or {}
    if specific.get("data-file"):
        raise _data_file_refused(specific["data-file"])
    if specific.get("encrypt"):
        raise _encrypted()
    if fmt != "vmdk":
        return None
    kind = specific.get("create-type")
    if kind not in VMDK_TYPES:
        raise DiskRefused(f"a vmdk disk of type {kind} is not accepted; export it as streamOptimized")
    if any(extent.get("filename") != str(path) for extent in specific.get("extents", ())):
        raise DiskRefused("the vmdk disk names other files as its extents; export it as one streamOptimized file")
    return kind


def _size(n):
    for unit, scale in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{n} bytes"


size_text = _size  # the same words in the uploads' messages


# --- convert ----------------------------------------------------------------------------------

_OUTPUT_OPTIONS = {"qcow2": [], "raw": [], "vmdk": ["-o", "subformat=streamOptimized"]}


def convert(path, dest, *, from_format, to_format, timeout):
    """Write the inspected disk ``path`` (read as ``from_format``) to ``dest`` as ``to_format``.

    qemu-img writes a temporary file beside ``dest``, which is renamed onto ``dest`` only when
    complete; on any failure neither the temporary file nor ``dest`` is left (an existing
    ``dest`` stays as it was). ``DiskError`` says why.
    """
    if to_format not in _OUTPUT_OPTIONS:
        raise DiskError(f"cannot convert to {to_format}")
    source = _spec(Path(os.path.abspath(path)), from_format)
    dest = Path(os.path.abspath(dest))
    handle, temp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    os.close(handle)
    try:
        args = ["convert", "-q", "-O", to_format, *_OUTPUT_OPTIONS[to_format], source, temp]
        try:
            code, _out, err = _qemu_img(args, timeout=timeout, limited=False, hide=(source,))
        except subprocess.TimeoutExpired:
            raise DiskError(f"qemu-img convert did not finish within {timeout} s") from None
        if code != 0:
            raise DiskError(f"qemu-img convert failed: {err}")
        _fsync(temp)
        os.replace(temp, dest)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return dest


def _fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- OVA ----------------------------------------------------------------------------------------


def inspect_ova(path, *, workdir, max_virtual_bytes, max_file_bytes, max_members=MAX_OVA_MEMBERS):
    """Check the OVA at ``path`` and extract its disks into a new private folder under
    ``workdir`` (``OvaInfo.directory``: the caller removes it, ``OvaInfo.remove()``), or
    ``DiskRefused`` with nothing left behind. See the module docstring."""
    path = Path(os.path.abspath(path))
    size = _regular_size(path)
    if size > max_file_bytes:
        raise DiskRefused(f"the file is {_size(size)}, over the limit of {_size(max_file_bytes)}")
    try:
        with tarfile.open(path, "r:") as tar:
            members = _members(tar, max_members, max_file_bytes)
            digests = _manifest(tar, members)
            ovf_name, disk_names = _read_ovf(tar, members, digests)
            limits = (max_virtual_bytes, max_file_bytes)
            return _extract_disks(tar, members, digests, ovf_name, disk_names, workdir, limits)
    except tarfile.TarError as exc:
        raise DiskRefused(f"the file is not a readable OVA (an uncompressed tar archive): {exc}") from None


def _members(tar, max_members, max_file_bytes):
    members = {}
    for member in tar:
        if len(members) == max_members:
            raise DiskRefused(f"the OVA holds more than {max_members} files")
        _check_member(member, max_file_bytes)
        if member.name in members:
            raise DiskRefused(f"the OVA holds {member.name!r} twice")
        members[member.name] = member
    return members


def _check_member(member, max_file_bytes):
    name = member.name
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise DiskRefused(f"the OVA member {name!r} has an absolute path")
    if ".." in name.replace("\\", "/").split("/"):
        raise DiskRefused(f"the OVA member {name!r} points outside the archive (..)")
    if member.issym() or member.islnk():
        raise DiskRefused(f"the OVA member {name!r} is a link; an OVA holds plain files only")
    if not member.isreg() or member.issparse():
        raise DiskRefused(f"the OVA member {name!r} is not a plain file; an OVA holds plain files only")
    if "/" in name or "\\" in name or not name.strip("."):
        raise DiskRefused(f"the OVA member {name!r} is in a folder; an OVA holds its files side by side")
    if member.size > max_file_bytes:
        raise DiskRefused(f"the OVA member {name!r} is {_size(member.size)}, over the limit of {_size(max_file_bytes)}")


_OVF_NS = ("http://schemas.dmtf.org/ovf/envelope/1", "http://schemas.dmtf.org/ovf/envelope/2")


def _small(tar, members, suffix, what):
    """The one member named ``*suffix`` (or None), and its bytes, at most MAX_OVF_BYTES."""
    found = [name for name in members if name.lower().endswith(suffix)]
    if len(found) > 1:
        raise DiskRefused(f"the OVA holds {len(found)} {what}s; it may hold one")
    if not found:
        return None, None
    if members[found[0]].size > MAX_OVF_BYTES:
        raise DiskRefused(f"the OVA's {what} is over {_size(MAX_OVF_BYTES)}")
    return found[0], tar.extractfile(members[found[0]]).read()


_MANIFEST_LINE = re.compile(r"(SHA1|SHA256|SHA512)\((.+)\)\s*=\s*([0-9a-fA-F]+)")


def _manifest(tar, members):
    """The digests of the OVA's manifest (``.mf``), by file name; none without one."""
    _name, text = _small(tar, members, ".mf", "manifest")
    digests = {}
    for number, line in enumerate((text or b"").decode(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        match = _MANIFEST_LINE.fullmatch(line.strip())
        if match is None:
            raise DiskRefused(f"line {number} of the OVA's manifest is not ALGORITHM(file)= digest")
        algorithm, name, digest = match.groups()
        digests[name] = (algorithm.lower(), digest.lower())
    return digests


def _verify(digests, name, chunks):
    """Refuse ``name`` if its bytes (``chunks``) differ from the manifest's digest of it."""
    if name not in digests:
        return
    algorithm, expected = digests[name]
    digest = hashlib.new(algorithm)
    for chunk in chunks:
        digest.update(chunk)
    if digest.hexdigest() != expected:
        raise DiskRefused(f"{name} does not match the OVA's manifest: the upload is damaged, upload it again")


def _read_ovf(tar, members, digests):
    """The descriptor's name and the member names of the disks it declares."""
    ovf_name, text = _small(tar, members, ".ovf", "OVF descriptor")
    if ovf_name is None:
        raise DiskRefused("the OVA holds no OVF descriptor (.ovf)")
    _verify(digests, ovf_name, [text])
    try:
        root = parse_xml(text, forbid_dtd=True)
    except DefusedXmlException:
        raise DiskRefused("the OVF descriptor declares a DTD or entities, which are not allowed") from None
    except ParseError as exc:
        raise DiskRefused(f"the OVF descriptor is not valid XML ({exc})") from None
    files = {_attr(node, "id"): node for node in _all(root, "File")}
    disks = list(_all(root, "Disk"))
    if not disks:
        raise DiskRefused("the OVF descriptor declares no disk")
    for node in files.values():
        _check_reference(node, members)
    names = []
    for disk in disks:
        ref = _attr(disk, "fileRef")
        if ref not in files:
            raise DiskRefused(f"the OVF disk {_attr(disk, 'diskId')!r} names no file of the OVA")
        names.append(_attr(files[ref], "href"))
    return ovf_name, names


def _check_reference(node, members):
    href = _attr(node, "href") or ""
    if _attr(node, "compression") or _attr(node, "chunkSize"):
        raise DiskRefused(f"the OVF file {href!r} is compressed or chunked; export the OVA without either")
    if href not in members:
        raise DiskRefused(f"the OVF descriptor references {href!r}, which is not in the OVA")


def _all(root, local):
    return (node for node in root.iter() if isinstance(node.tag, str) and node.tag.rpartition("}")[2] == local)


def _attr(node, local):
    for ns in _OVF_NS:
        value = node.get(f"{{{ns}}}{local}")
        if value is not None:
            return value
    return node.get(local)


def _extract_disks(tar, members, digests, ovf_name, names, workdir, limits):
    directory = Path(tempfile.mkdtemp(prefix="ova-", dir=workdir))  # mode 0700
    try:
        disks = []
        for name in dict.fromkeys(names):
            tar.extract(members[name], path=directory, filter="data")
            target = directory / name
            with open(target, "rb") as handle:
                _verify(digests, name, iter(lambda handle=handle: handle.read(1 << 20), b""))
            info = _inspect(target, "vmdk", ("vmdk",), *limits)
            disks.append(OvaDisk(name=name, path=target, info=info))
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return OvaInfo(directory=directory, ovf_name=ovf_name, disks=tuple(disks))
