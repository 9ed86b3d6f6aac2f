"""Uploaded disk images checked and converted (``provisioning/disks.py``) with the real
qemu-img, on files each test builds: good ones pass with their sizes, malformed, truncated,
oversized and malicious ones are refused with a reason and leave nothing behind."""

import gzip
import hashlib
import io
import re
import subprocess
import tarfile

import pytest

from provisioning import disks
from provisioning.disks import DiskError, DiskRefused

MIB = 1 << 20
LIMITS = {"max_virtual_bytes": 1 << 30, "max_file_bytes": 64 * MIB}


def qemu_img(*args):
    subprocess.run(["qemu-img", *args], check=True, capture_output=True, timeout=60)


def qcow2(path, size="64M", *options):
    qemu_img("create", "-q", "-f", "qcow2", *options, str(path), size)
    return path


def refused(path, match, **kwargs):
    with pytest.raises(DiskRefused, match=match) as caught:
        disks.inspect(path, **{**LIMITS, **kwargs})
    return caught.value.reason


def test_a_good_qcow2_and_raw_pass_with_their_sizes(tmp_path):
    info = disks.inspect(qcow2(tmp_path / "good.qcow2"), **LIMITS)
    assert (info.format, info.virtual_size, info.looks_like) == ("qcow2", 64 * MIB, "qcow2")
    assert info.file_size == (tmp_path / "good.qcow2").stat().st_size
    raw = tmp_path / "good.img"
    raw.write_bytes(b"\xeb\x63\x90" + bytes(3 * MIB - 3))
    for declared in (None, "raw"):
        info = disks.inspect(raw, declared_format=declared, **LIMITS)
        assert (info.format, info.virtual_size, info.file_size, info.looks_like) == ("raw", 3 * MIB, 3 * MIB, None)


@pytest.fixture(params=["header", "qemu-img"])
def refusing(request, monkeypatch):
    """The header read here refuses first; qemu-img info's report is the second line, run alone."""
    if request.param == "qemu-img":
        monkeypatch.setattr(disks, "_check_qcow2_header", lambda head: None)
    return request.param


def test_it_refuses_a_backing_file_on_the_host_naming_it(tmp_path, refusing):
    image = qcow2(tmp_path / "overlay.qcow2", "64M", "-b", "/etc/passwd", "-F", "raw")
    reason = refused(image, r"backing file \(/etc/passwd\)", declared_format="qcow2")
    assert "qemu-img convert" in reason
    refused(image, r"backing file \(/etc/passwd\)")  # detected as qcow2 without a declaration


def test_it_refuses_a_json_pseudo_protocol_backing_file(tmp_path, refusing):
    backing = 'json:{"driver":"raw","file":{"driver":"file","filename":"/etc/shadow"}}'
    image = qcow2(tmp_path / "overlay.qcow2", "64M", "-u", "-b", backing, "-F", "raw")
    refused(image, r"backing file \(json:\{.*/etc/shadow")


def test_qemu_img_never_opens_a_backing_file_even_unrefused(tmp_path, monkeypatch):
    """The third line: with both refusals off, qemu-img check (which opens a backing file
    by default) still reads the overlay alone: a missing backing file goes unnoticed."""
    monkeypatch.setattr(disks, "_check_qcow2_header", lambda head: None)
    monkeypatch.setattr(disks, "_refuse_by_info", lambda info, fmt, path: None)
    image = qcow2(tmp_path / "overlay.qcow2", "64M", "-u", "-b", str(tmp_path / "missing.raw"), "-F", "raw")
    assert disks.inspect(image, **LIMITS).virtual_size == 64 * MIB


def test_a_raw_disk_holding_a_qcow2_header_is_read_as_raw_when_declared_raw(tmp_path):
    """A guest may write anything into its raw disk, a qcow2 header naming /etc/passwd too:
    declared raw it stays raw, and what it names is never read."""
    header = qcow2(tmp_path / "evil.qcow2", "64M", "-b", "/etc/passwd", "-F", "raw").read_bytes()
    raw = tmp_path / "disk.img"
    raw.write_bytes(header.ljust(MIB, b"\0"))
    info = disks.inspect(raw, declared_format="raw", **LIMITS)
    assert (info.format, info.virtual_size, info.looks_like) == ("raw", MIB, "qcow2")


def test_it_refuses_a_truncated_qcow2(tmp_path):
    data = tmp_path / "data.raw"
    data.write_bytes(bytes(range(256)) * (4 * 4096))  # 4 MiB of allocated clusters
    whole = tmp_path / "whole.qcow2"
    qemu_img("convert", "-q", "-f", "raw", "-O", "qcow2", str(data), str(whole))
    assert disks.inspect(whole, **LIMITS).virtual_size == 4 * MIB
    cut = tmp_path / "cut.qcow2"
    cut.write_bytes(whole.read_bytes()[: 2 * MIB])
    refused(cut, r"the qcow2 image is corrupt or truncated \(qemu-img check found \d+ errors\); upload it again")


def test_it_refuses_sizes_over_the_limits(tmp_path):
    big = qcow2(tmp_path / "big.qcow2", "2G")
    refused(big, r"the virtual size 2 GiB is over the limit of 1 GiB")
    raw = tmp_path / "big.img"
    raw.write_bytes(bytes(2 * MIB))
    refused(raw, r"the file is 2 MiB, over the limit of 1 MiB", max_file_bytes=MIB)


def test_it_refuses_a_file_that_is_not_what_it_is_declared_to_be(tmp_path):
    text = tmp_path / "notes.qcow2"
    text.write_text("not a disk at all\n" * 100)
    refused(text, r"the file is not a qcow2 image \(its first bytes look like raw data\)", declared_format="qcow2")
    refused(text, r"format vhd is not accepted; upload qcow2 or raw", declared_format="vhd")


def test_it_refuses_formats_other_than_qcow2_and_raw(tmp_path):
    raw = tmp_path / "disk.img"
    raw.write_bytes(bytes(MIB))
    for fmt in ("vhdx", "vmdk"):
        qemu_img("convert", "-q", "-f", "raw", "-O", fmt, str(raw), str(tmp_path / f"disk.{fmt}"))
    refused(tmp_path / "disk.vhdx", r"vhdx images are not accepted; upload qcow2 or raw")
    refused(tmp_path / "disk.vmdk", r"vmdk images are not accepted")
    refused(tmp_path / "disk.vmdk", r"a vmdk disk is accepted only inside an OVA", declared_format="vmdk")


def test_it_refuses_an_external_data_file_and_encryption(tmp_path, refusing):
    image = qcow2(tmp_path / "split.qcow2", "64M", "-o", f"data_file={tmp_path / 'data.raw'}")
    where = "" if refusing == "header" else f" ({tmp_path / 'data.raw'})"
    refused(image, rf"the image keeps its data in an external data file{re.escape(where)}; upload a standalone")
    encrypted = qcow2(
        tmp_path / "secret.qcow2",
        "64M",
        "--object",
        "secret,id=sec0,data=123456",
        "-o",
        "encrypt.format=aes,encrypt.key-secret=sec0",  # luks benchmarks the CPU: not in every container
    )
    refused(encrypted, r"the image is encrypted; upload it unencrypted")


def test_it_refuses_a_link_and_an_image_qemu_img_takes_too_long_over(tmp_path, monkeypatch):
    image = qcow2(tmp_path / "good.qcow2")
    (tmp_path / "link.qcow2").symlink_to(image)
    refused(tmp_path / "link.qcow2", r"the upload is not a regular file")
    monkeypatch.setattr(disks, "INFO_SECONDS", 0.001)
    refused(image, r"qemu-img could not read the qcow2 image within 0.001 s")


def test_the_limits_come_from_settings(settings):
    settings.IMAGE_UPLOAD_MAX_VIRTUAL_GIB, settings.IMAGE_UPLOAD_MAX_FILE_GIB = 7, 3
    assert disks.upload_limits() == {"max_virtual_bytes": 7 << 30, "max_file_bytes": 3 << 30}


def test_convert_writes_the_new_format_atomically(tmp_path, out_dir):
    raw = tmp_path / "disk.img"
    raw.write_bytes(bytes(range(256)) * (4 * 4096))
    dest = disks.convert(raw, out_dir / "disk.qcow2", from_format="raw", to_format="qcow2", timeout=60)
    info = disks.inspect(dest, declared_format="qcow2", **LIMITS)
    assert (info.format, info.virtual_size) == ("qcow2", 4 * MIB)
    qemu_img("compare", "-q", "-f", "raw", "-F", "qcow2", str(raw), str(dest))
    assert sorted(p.name for p in dest.parent.iterdir()) == ["disk.qcow2"]


@pytest.fixture
def out_dir(tmp_path):
    path = tmp_path / "out"
    path.mkdir()
    return path


def test_a_failing_convert_leaves_nothing(tmp_path, out_dir):
    text = tmp_path / "notes.txt"
    text.write_text("not a qcow2\n")
    with pytest.raises(DiskError, match="qemu-img convert failed"):
        disks.convert(text, out_dir / "disk.qcow2", from_format="qcow2", to_format="qcow2", timeout=60)
    assert list(out_dir.iterdir()) == []
    (out_dir / "disk.qcow2").write_bytes(b"the previous one")
    with pytest.raises(DiskError, match="qemu-img convert failed"):
        disks.convert(text, out_dir / "disk.qcow2", from_format="qcow2", to_format="qcow2", timeout=60)
    assert [p.name for p in out_dir.iterdir()] == ["disk.qcow2"]
    assert (out_dir / "disk.qcow2").read_bytes() == b"the previous one"


# --- OVA ------------------------------------------------------------------------------------

OVF = """<?xml version="1.0" encoding="UTF-8"?>
<Envelope xmlns="http://schemas.dmtf.org/ovf/envelope/1"
          xmlns:ovf="http://schemas.dmtf.org/ovf/envelope/1">
  <References><File ovf:id="file1" ovf:href="{href}"/></References>
  <DiskSection><Info>disks</Info>
    <Disk ovf:diskId="vmdisk1" ovf:fileRef="file1" ovf:capacity="4194304"
          ovf:format="http://www.vmware.com/interfaces/specifications/vmdk.html#streamOptimized"/>
  </DiskSection>
  <VirtualSystem ovf:id="vm"><Info>a VM</Info></VirtualSystem>
</Envelope>
"""

BOMB = """<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]>
<Envelope xmlns="http://schemas.dmtf.org/ovf/envelope/1">&lol3;</Envelope>
"""


@pytest.fixture
def vmdk(tmp_path):
    raw = tmp_path / "disk.img"
    raw.write_bytes(bytes(range(256)) * (4 * 4096))
    path = tmp_path / "disk.vmdk"
    qemu_img("convert", "-q", "-f", "raw", "-O", "vmdk", "-o", "subformat=streamOptimized", str(raw), str(path))
    return path.read_bytes()


def make_ova(path, members):
    """An OVA of (name, bytes) regular files, or TarInfo members given as they are."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
                continue
            name, data = member
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def link(name, kind, target):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


@pytest.fixture
def workdir(tmp_path):
    path = tmp_path / "work"
    path.mkdir()
    return path


def test_a_good_ova_passes_with_its_disk_extracted(tmp_path, vmdk, workdir):
    ova = make_ova(tmp_path / "vm.ova", [("vm.ovf", OVF.format(href="disk1.vmdk").encode()), ("disk1.vmdk", vmdk)])
    found = disks.inspect_ova(ova, workdir=workdir, **LIMITS)
    (disk,) = found.disks
    assert (found.ovf_name, disk.name) == ("vm.ovf", "disk1.vmdk")
    assert (disk.info.format, disk.info.subformat, disk.info.virtual_size) == ("vmdk", "streamOptimized", 4 * MIB)
    assert disk.path.read_bytes() == vmdk and disk.path.parent == found.directory
    assert found.directory.parent == workdir and found.directory.stat().st_mode & 0o777 == 0o700
    for_libvirt = disks.convert(disk.path, tmp_path / "vm.qcow2", from_format="vmdk", to_format="qcow2", timeout=60)
    qemu_img("compare", "-q", "-f", "raw", "-F", "qcow2", str(tmp_path / "disk.img"), str(for_libvirt))
    found.remove()
    assert list(workdir.iterdir()) == []


@pytest.mark.parametrize(
    ("extra", "href", "reason"),
    [
        ([("../evil", b"x")], "disk1.vmdk", r"the OVA member '../evil' points outside the archive \(..\)"),
        ([("/abs", b"x")], "disk1.vmdk", r"the OVA member '/abs' has an absolute path"),
        ([link("etc", tarfile.SYMTYPE, "/etc")], "disk1.vmdk", r"the OVA member 'etc' is a link"),
        ([link("pw", tarfile.LNKTYPE, "/etc/passwd")], "disk1.vmdk", r"the OVA member 'pw' is a link"),
        ([link("dev", tarfile.CHRTYPE, "")], "disk1.vmdk", r"the OVA member 'dev' is not a plain file"),
        ([("sub/x", b"x")], "disk1.vmdk", r"the OVA member 'sub/x' is in a folder"),
        ([], "disk2.vmdk", r"the OVF descriptor references 'disk2.vmdk', which is not in the OVA"),
        ([], "../disk1.vmdk", r"the OVF descriptor references '../disk1.vmdk', which is not in the OVA"),
    ],
    ids=["dotdot", "absolute", "symlink", "hardlink", "device", "folder", "missing-disk", "href-dotdot"],
)
def test_it_refuses_an_unsafe_ova_leaving_nothing(tmp_path, vmdk, workdir, extra, href, reason):
    ovf = ("vm.ovf", OVF.format(href=href).encode())
    ova = make_ova(tmp_path / "vm.ova", [ovf, ("disk1.vmdk", vmdk), *extra])
    with pytest.raises(DiskRefused, match=reason):
        disks.inspect_ova(ova, workdir=workdir, **LIMITS)
    assert list(workdir.iterdir()) == []


def test_it_refuses_an_xml_bomb_and_a_missing_or_broken_descriptor(tmp_path, vmdk, workdir):
    cases = [
        ([("vm.ovf", BOMB.encode()), ("disk1.vmdk", vmdk)], r"the OVF descriptor declares a DTD or entities"),
        ([("disk1.vmdk", vmdk)], r"the OVA holds no OVF descriptor \(.ovf\)"),
        ([("vm.ovf", b"<Envelope"), ("disk1.vmdk", vmdk)], r"the OVF descriptor is not valid XML"),
    ]
    for members, reason in cases:
        with pytest.raises(DiskRefused, match=reason):
            disks.inspect_ova(make_ova(tmp_path / "vm.ova", members), workdir=workdir, **LIMITS)
        assert list(workdir.iterdir()) == []


def test_the_manifest_is_checked_when_there_is_one(tmp_path, vmdk, workdir):
    ovf = OVF.format(href="disk1.vmdk").encode()
    good = f"SHA256(vm.ovf)= {hashlib.sha256(ovf).hexdigest()}\nSHA1(disk1.vmdk)= {hashlib.sha1(vmdk).hexdigest()}\n"
    ova = make_ova(tmp_path / "vm.ova", [("vm.ovf", ovf), ("vm.mf", good.encode()), ("disk1.vmdk", vmdk)])
    disks.inspect_ova(ova, workdir=workdir, **LIMITS).remove()
    damaged = vmdk[:-1] + b"x"
    cases = [
        ([("vm.mf", good.encode()), ("disk1.vmdk", damaged)], r"disk1.vmdk does not match the OVA's manifest"),
        ([("vm.mf", b"SHA256 vm.ovf abc\n"), ("disk1.vmdk", vmdk)], r"line 1 of the OVA's manifest is not"),
    ]
    for members, reason in cases:
        with pytest.raises(DiskRefused, match=reason):
            disks.inspect_ova(make_ova(tmp_path / "bad.ova", [("vm.ovf", ovf), *members]), workdir=workdir, **LIMITS)
        assert list(workdir.iterdir()) == []


def test_it_refuses_a_compressed_ova_and_two_descriptors(tmp_path, vmdk, workdir):
    ovf = ("vm.ovf", OVF.format(href="disk1.vmdk").encode())
    ova = make_ova(tmp_path / "vm.ova", [ovf, ("disk1.vmdk", vmdk)])
    packed = tmp_path / "packed.ova"
    packed.write_bytes(gzip.compress(ova.read_bytes()))
    with pytest.raises(DiskRefused, match=r"the file is not a readable OVA \(an uncompressed tar archive\)"):
        disks.inspect_ova(packed, workdir=workdir, **LIMITS)
    two = make_ova(tmp_path / "two.ova", [ovf, ("other.ovf", ovf[1]), ("disk1.vmdk", vmdk)])
    with pytest.raises(DiskRefused, match=r"the OVA holds 2 OVF descriptors; it may hold one"):
        disks.inspect_ova(two, workdir=workdir, **LIMITS)
    assert list(workdir.iterdir()) == []


def test_it_refuses_an_ova_disk_that_is_a_descriptor_of_host_files(tmp_path, workdir):
    descriptor = b'# Disk DescriptorFile\nversion=1\ncreateType="monolithicFlat"\nRW 8 FLAT "/etc/passwd" 0\n'
    ovf = ("vm.ovf", OVF.format(href="disk1.vmdk").encode())
    ova = make_ova(tmp_path / "vm.ova", [ovf, ("disk1.vmdk", descriptor)])
    with pytest.raises(DiskRefused, match=r"the vmdk disk is a descriptor naming other files"):
        disks.inspect_ova(ova, workdir=workdir, **LIMITS)
    assert list(workdir.iterdir()) == []


def test_it_refuses_too_many_members_an_oversized_ova_and_a_truncated_disk(tmp_path, vmdk, workdir):
    ovf = ("vm.ovf", OVF.format(href="disk1.vmdk").encode())
    many = make_ova(tmp_path / "many.ova", [ovf, ("disk1.vmdk", vmdk), *[(f"f{i}", b"") for i in range(4)]])
    with pytest.raises(DiskRefused, match=r"the OVA holds more than 5 files"):
        disks.inspect_ova(many, workdir=workdir, max_members=5, **LIMITS)
    big = make_ova(tmp_path / "big.ova", [ovf, ("disk1.vmdk", vmdk), ("pad", bytes(MIB))])
    with pytest.raises(DiskRefused, match=r"the file is 1.\d MiB, over the limit of 1 MiB"):
        disks.inspect_ova(big, workdir=workdir, **{**LIMITS, "max_file_bytes": MIB})
    truncated = vmdk[: len(vmdk) // 2]
    cut = make_ova(tmp_path / "cut.ova", [ovf, ("disk1.vmdk", truncated)])
    with pytest.raises(DiskRefused, match=r"the vmdk image is corrupt or truncated \(.+\); upload it again"):
        disks.inspect_ova(cut, workdir=workdir, **LIMITS)
    assert list(workdir.iterdir()) == []
