#!/usr/bin/env python3
"""Build vclmgr's test guest from Debian packages only, once, and print its directory.

The guest is what a real cloud image does for vclmgr, cut to the bone: boot, read the
cloud-init NoCloud seed from the ``cidata`` CD-ROM (the subset of cloud-config vclmgr emits:
user, password hash, authorised keys, hostname, DHCP), then serve SSH (Debian's dropbear) and
the QEMU guest agent. Its userland is busybox-static plus those two programs and the shared
libraries they need; the kernel is Debian's ``linux-image-amd64``. Nothing is compiled.

Output, under ``$GUEST_IMAGE_CACHE`` (default ``var/tools``) in ``guest-<key>/``, where the key
hashes this directory's files and the exact versions of every Debian package used:

- ``disk.qcow2``: a bootable disk (MBR + one FAT partition with SYSLINUX, the compressed kernel
  and the initramfs), the way real images boot;
- ``vmlinux`` + ``initrd``: the same kernel uncompressed and the same initramfs, for direct
  kernel boot (``<kernel>``/``<initrd>``, PVH entry), which skips BIOS, bootloader and the
  kernel's self-decompression;
- ``guest.json``: what was built from which versions, and the kernel command line.

A build takes under a minute; the ``.deb`` files are kept in ``guest-debs/`` so a rebuild after
an edit here does not download again. Parallel callers wait on a lock for one build.
Host tools used: apt-get/apt-cache, dpkg-deb, mtools, syslinux (its mtools-based installer, so
no mount and no root), qemu-img.
"""

import fcntl
import hashlib
import json
import lzma
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CACHE = Path(os.environ.get("GUEST_IMAGE_CACHE", ROOT / "var" / "tools"))

KERNEL_META = "linux-image-amd64"
USERLAND = ["busybox-static", "dropbear-bin", "qemu-guest-agent"]
# Programs copied into the guest, with the shared libraries their ELF headers ask for
# (dbclient: SSH from one guest to another, as a user of an environment goes on from its entry machine).
PROGRAMS = ["usr/sbin/dropbear", "usr/bin/dropbearkey", "usr/bin/dbclient", "usr/sbin/qemu-ga"]
# Kernel modules the guest loads at boot (their dependencies are added and ordered here):
# virtio devices, the seed CD-ROM on IDE (pc), SATA (q35) or virtio-scsi, and its filesystem.
MODULES = [
    "virtio_pci",
    "virtio_net",
    "virtio_blk",
    "virtio_scsi",
    "virtio_console",
    "virtio_rng",
    "ata_piix",
    "ahci",
    "sr_mod",
    "isofs",
]
CMDLINE = (
    "console=ttyS0 cryptomgr.notests mitigations=off i8042.noaux i8042.nokbd i8042.nopnp"
    " tsc=reliable no_timer_check quiet"
)
DISK_MIB = 64
PART_START = 2048  # sectors: the partition starts at 1 MiB, as partitioning tools do
SYSLINUX_MBR = Path("/usr/lib/syslinux/mbr/mbr.bin")
GUEST_FILES = ["init.sh", "udhcpc.sh", "inittab"]
HOST_TOOLS = ("syslinux", "syslinux-common", "mtools")


def run(*args, **kw):
    return subprocess.run(args, check=True, text=True, capture_output=True, **kw).stdout


def apt_show(packages):
    """Version and Depends of the candidates of ``packages``, read from the local lists (no
    network), in one apt-cache call: each call costs seconds on a loaded machine."""
    try:
        out = run("apt-cache", "show", "--no-all-versions", *packages)
    except subprocess.CalledProcessError:
        apt_update()  # a fresh machine may have no package lists yet
        out = run("apt-cache", "show", "--no-all-versions", *packages)
    info = {}
    for stanza in out.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line.startswith(" "))
        info[fields["Package"]] = (fields["Version"], fields.get("Depends", ""))
    return info


def apt_update():
    print("guest-image: apt-get update", file=sys.stderr)
    run("apt-get", "update", "-qq")


def depends_names(field):
    # "libc6 (>= 2.34), libfoo | libbar" -> ["libc6", "libfoo"] (first alternative)
    return [alt.split("|")[0].split()[0].split(":")[0] for alt in field.split(",") if alt.strip()]


def resolve_packages():
    """Exact versions of the kernel, the userland and the libraries the userland links."""
    kdeps = apt_show([KERNEL_META])[KERNEL_META][1]
    kernel = next(n for n in depends_names(kdeps) if n.startswith("linux-image-"))
    versions, level = {}, [kernel, *USERLAND]
    while level:
        info = apt_show(level)
        level = []
        for name, (version, deps) in info.items():
            versions[name] = version
            if name != kernel:  # only shared libraries follow; init-system-helpers, debconf … do not
                level += [d for d in depends_names(deps) if (d.startswith("lib") or d == "zlib1g")]
        level = sorted(set(level) - set(versions))
    return kernel, dict(sorted(versions.items()))


def resolve_packages_cached():
    """``resolve_packages`` remembered until apt's lists change (``apt-get update``)."""
    lists = sorted(Path("/var/lib/apt/lists").glob("*_Packages*"))
    stamp = hashlib.sha256(repr([(p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in lists]).encode())
    stamp.update(json.dumps([KERNEL_META, USERLAND]).encode())
    memo = CACHE / "guest-packages.json"
    try:
        saved = json.loads(memo.read_text())
        if saved["stamp"] == stamp.hexdigest():
            return saved["kernel"], saved["versions"]
    except (OSError, ValueError, KeyError):
        pass
    kernel, versions = resolve_packages()
    memo.write_text(json.dumps({"stamp": stamp.hexdigest(), "kernel": kernel, "versions": versions}))
    return kernel, versions


def host_tool_versions():
    query = subprocess.run(
        ["dpkg-query", "-W", "-f=${Package} ${Version}\\n", *HOST_TOOLS], text=True, capture_output=True
    )
    found = dict(line.split(" ", 1) for line in query.stdout.splitlines() if " " in line)
    return {pkg: found.get(pkg) or "missing" for pkg in HOST_TOOLS}


def cache_key(versions, tools):
    h = hashlib.sha256()
    for name in ["build.py", *GUEST_FILES]:
        h.update(name.encode() + b"\0" + (HERE / name).read_bytes())
    h.update(json.dumps([versions, tools, CMDLINE, MODULES], sort_keys=True).encode())
    return h.hexdigest()[:16]


def download(versions, debs):
    debs.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, version in versions.items():
        found = [p for p in debs.glob(f"{name}_*.deb") if p.name.split("_")[1].replace("%3a", ":") == version]
        if not found:
            # apt's _apt user must be able to write here, or it warns and downloads as root.
            run("apt-get", "download", "-qq", f"{name}={version}", cwd=debs)
            found = [p for p in debs.glob(f"{name}_*.deb") if p.name.split("_")[1].replace("%3a", ":") == version]
        paths[name] = found[0]
    return paths


# --- ELF: the libraries a program needs (DT_NEEDED), without binutils -------------------------


def elf_needed(path):
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return []
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    needed = []
    for _, sh_type, _, _, off, size, link, _, _, _ in sections:
        if sh_type != 6:  # SHT_DYNAMIC
            continue
        stroff = sections[link][4]
        for i in range(0, size, 16):
            tag, val = struct.unpack_from("<qQ", data, off + i)
            if tag == 1:  # DT_NEEDED
                end = data.index(b"\0", stroff + val)
                needed.append(data[stroff + val : end].decode())
    return needed


def library_closure(stage, programs):
    libdirs = [stage / "lib/x86_64-linux-gnu", stage / "usr/lib/x86_64-linux-gnu"]
    found, todo = {}, list(programs)
    while todo:
        for soname in elf_needed(todo.pop()):
            if soname in found:
                continue
            path = next((d / soname for d in libdirs if (d / soname).exists()), None)
            if path is None:
                raise SystemExit(f"guest-image: {soname} is in none of the downloaded packages")
            found[soname] = path.resolve()
            todo.append(found[soname])
    return found


# --- kernel modules: dependencies from .modinfo, loaded in order by the guest ------------------


def modinfo_depends(ko):
    data = ko.read_bytes()
    at = data.find(b"\0depends=")
    if at < 0:
        return []
    raw = data[at + 9 : data.index(b"\0", at + 1)].decode()
    return [d for d in raw.split(",") if d]


def module_order(moddir, wanted):
    by_name = {ko.name[:-3].replace("-", "_"): ko for ko in moddir.rglob("*.ko")}
    builtin = {Path(line).name[:-3].replace("-", "_") for line in (moddir / "modules.builtin").read_text().split()}
    order, seen = [], set()

    def visit(name):
        name = name.replace("-", "_")
        if name in seen or name in builtin:
            return
        seen.add(name)
        if name not in by_name:
            raise SystemExit(f"guest-image: kernel module {name} not found")
        for dep in modinfo_depends(by_name[name]):
            visit(dep)
        order.append(by_name[name])

    for name in wanted:
        visit(name)
    return order


def extract_vmlinux(vmlinuz):
    """The ELF kernel inside a bzImage (like the kernel's scripts/extract-vmlinux, for xz)."""
    data = vmlinuz.read_bytes()
    at = data.find(b"\xfd7zXZ\x00")
    while at >= 0:
        try:
            out = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[at:])
            if out[:4] == b"\x7fELF":
                return out
        except lzma.LZMAError:
            pass
        at = data.find(b"\xfd7zXZ\x00", at + 1)
    raise SystemExit(f"guest-image: no xz-compressed ELF kernel found in {vmlinuz}")


# --- initramfs: a newc cpio written directly (reproducible: uid 0, mtime 0) -------------------


class Cpio:
    def __init__(self):
        self.parts, self.ino, self.dirs = [], 1, set()

    def _entry(self, name, mode, data=b"", rdev=(0, 0)):
        self.ino += 1
        header = "070701" + "".join(
            f"{v:08x}" for v in (self.ino, mode, 0, 0, 1, 0, len(data), 0, 0, *rdev, len(name) + 1, 0)
        )
        blob = header.encode() + name.encode() + b"\0"
        blob += b"\0" * (-len(blob) % 4) + data + b"\0" * (-len(data) % 4)
        self.parts.append(blob)

    def dir(self, name):
        parts = name.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            sub = "/".join(parts[:i])
            if sub not in self.dirs:
                self.dirs.add(sub)
                self._entry(sub, 0o40755)

    def file(self, name, data, mode=0o644):
        self.dir(os.path.dirname(name))
        self._entry(name, 0o100000 | mode, data)

    def symlink(self, name, target):
        self.dir(os.path.dirname(name))
        self._entry(name, 0o120777, target.encode())

    def chardev(self, name, major, minor, mode=0o600):
        self.dir(os.path.dirname(name))
        self._entry(name, 0o20000 | mode, rdev=(major, minor))

    def bytes(self):
        self._entry("TRAILER!!!", 0)
        return b"".join(self.parts)


def initramfs(stage, kver):
    cpio = Cpio()
    for d in ("proc", "sys", "dev", "tmp", "run", "mnt/cidata", "root", "home", "etc/dropbear", "var/lib"):
        cpio.dir(d)
    cpio.symlink("var/run", "/run")
    cpio.symlink("var/log", "/tmp")
    cpio.chardev("dev/console", 5, 1)
    cpio.chardev("dev/null", 1, 3, 0o666)
    busybox = stage / "bin/busybox"
    cpio.file("bin/busybox", busybox.read_bytes(), 0o755)
    for applet in run(str(busybox), "--list-full").split():
        if applet != "bin/busybox":
            cpio.symlink(applet, "/bin/busybox")
    cpio.symlink("init", "/bin/busybox")  # busybox init as PID 1, so poweroff and reboot work
    for prog in PROGRAMS:
        cpio.file(prog, (stage / prog).read_bytes(), 0o755)
    for soname, path in library_closure(stage, [stage / p for p in PROGRAMS]).items():
        cpio.file(f"lib/x86_64-linux-gnu/{soname}", path.read_bytes(), 0o755)
    cpio.symlink("lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
    moddir = stage / "lib/modules" / kver
    order = module_order(moddir, MODULES)
    for ko in order:
        cpio.file(f"lib/modules/{ko.name}", ko.read_bytes())
    cpio.file("lib/modules/load.list", "".join(f"{ko.name}\n" for ko in order).encode())
    cpio.file("etc/inittab", (HERE / "inittab").read_bytes())
    cpio.file("etc/init.d/rcS", (HERE / "init.sh").read_bytes(), 0o755)
    cpio.file("etc/udhcpc.sh", (HERE / "udhcpc.sh").read_bytes(), 0o755)
    # qemu-ga's guest-shutdown runs "/sbin/shutdown -P|-r|-H +0 …"; busybox has no shutdown.
    cpio.file("sbin/shutdown", b'#!/bin/sh\ncase " $* " in *" -r "*) exec reboot ;; *) exec poweroff ;; esac\n', 0o755)
    cpio.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
    cpio.file("etc/shadow", b"root:*:19000:0:99999:7:::\n", 0o600)
    cpio.file("etc/group", b"root:x:0:\n")
    cpio.file("etc/shells", b"/bin/sh\n/bin/ash\n")
    cpio.file("etc/hosts", b"127.0.0.1 localhost\n")
    return cpio.bytes()


# --- bootable disk: MBR + FAT partition with SYSLINUX, written by mtools ----------------------


def disk_image(out, vmlinuz, initrd, work):
    raw = work / "disk.raw"
    sectors = DISK_MIB * 2048
    with open(raw, "wb") as f:
        f.truncate(sectors * 512)
    part = f"{raw}@@{PART_START * 512}"
    run(
        "mformat",
        "-i",
        part,
        "-T",
        str(sectors - PART_START),
        "-H",
        str(PART_START),
        "-h",
        "64",
        "-s",
        "32",
        "-v",
        "GUESTBOOT",
        "::",
    )
    run("syslinux", "--offset", str(PART_START * 512), "--install", str(raw))
    cfg = work / "syslinux.cfg"
    cfg.write_text(f"DEFAULT guest\nPROMPT 0\nLABEL guest\n  KERNEL /vmlinuz\n  INITRD /initrd\n  APPEND {CMDLINE}\n")
    for src, dst in ((vmlinuz, "vmlinuz"), (initrd, "initrd"), (cfg, "syslinux.cfg")):
        run("mcopy", "-i", part, str(src), f"::{dst}")
    # MBR: SYSLINUX's boot code, then one active FAT16 (LBA) partition.
    with open(raw, "r+b") as f:
        f.write(SYSLINUX_MBR.read_bytes()[:440])
        entry = struct.pack("<B3sB3sII", 0x80, b"\xfe\xff\xff", 0x0E, b"\xfe\xff\xff", PART_START, sectors - PART_START)
        f.seek(446)
        f.write(entry + b"\0" * 48 + b"\x55\xaa")
    run("qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", str(raw), str(out))


def build(target, kernel, versions, tools):
    with tempfile.TemporaryDirectory(prefix="guest-image-", dir=CACHE) as tmp:
        work = Path(tmp)
        stage = work / "stage"
        for deb in download(versions, CACHE / "guest-debs").values():
            run("dpkg-deb", "-x", str(deb), str(stage))
        kver = kernel.removeprefix("linux-image-")
        vmlinuz = stage / "boot" / f"vmlinuz-{kver}"
        out = work / "out"
        out.mkdir()
        (out / "initrd").write_bytes(initramfs(stage, kver))
        (out / "vmlinux").write_bytes(extract_vmlinux(vmlinuz))
        disk_image(out / "disk.qcow2", vmlinuz, out / "initrd", work)
        (out / "guest.json").write_text(
            json.dumps(
                {
                    "kernel": kver,
                    "cmdline": CMDLINE,
                    "packages": versions,
                    "host_tools": tools,
                    "disk": "disk.qcow2",
                    "vmlinux": "vmlinux",
                    "initrd": "initrd",
                },
                indent=2,
            )
            + "\n"
        )
        for p in out.iterdir():
            p.chmod(0o644)
        out.chmod(0o755)
        out.rename(target)


def main(retry=True):
    CACHE.mkdir(parents=True, exist_ok=True)
    kernel, versions = resolve_packages_cached()
    tools = host_tool_versions()
    target = CACHE / f"guest-{cache_key(versions, tools)}"
    try:
        build_once(target, kernel, versions, tools)
    except subprocess.CalledProcessError as exc:
        if not retry or list(exc.cmd[:2]) != ["apt-get", "download"]:
            raise SystemExit(f"guest-image: {' '.join(exc.cmd)} failed:\n{exc.stderr}") from None
        # The lists name a version the mirror no longer has (a point release came out).
        apt_update()
        (CACHE / "guest-packages.json").unlink(missing_ok=True)
        return main(retry=False)
    print(target)


def build_once(target, kernel, versions, tools):
    if (target / "guest.json").exists():
        return
    with open(CACHE / "guest-image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "guest.json").exists():  # another caller built it while we waited
            return
        print(f"guest-image: building {target} (once; under a minute)", file=sys.stderr)
        build(target, kernel, versions, tools)
        for old in CACHE.glob("guest-*"):
            if old.is_dir() and old != target and old.name != "guest-debs":
                shutil.rmtree(old, ignore_errors=True)


if __name__ == "__main__":
    main()
