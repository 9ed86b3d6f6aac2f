"""A real hypervisor for tests and benchmarks: the private libvirtd of ``tools/localkvm.py``,
and guests from the test image that ``tools/guest-image/build.py`` makes. No pytest and no
Django in here, so ``bench/real_vm.py`` uses the same code.

Network rule: guest traffic never leaves this machine. Each guest gets QEMU user-mode
networking with ``restrict=on`` (no route out, not even to the host) and one forward,
``127.0.0.1:PORT → guest:22``; libvirt 9.0's ``<interface type='user'>`` cannot forward ports
without passt, so the NIC is given as ``<qemu:commandline>`` arguments.
"""

import contextlib
import io
import ipaddress
import json
import os
import secrets
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from drivers import cloudinit
from tools.localkvm import (  # noqa: F401 (the daemon and image, for the tests and bench that import them from here)
    DAEMONS,
    PREFIX,
    ROOT,
    STATE,
    Libvirtd,
    RealVMError,
    _exe_name,
    _read_pid,
    guest_image,
)

# --- storage: a private pool per user, the image staged into it -----------------------------


class Pool:
    """A transient directory pool holding the staged base image, overlays and seeds."""

    def __init__(self, conn, image, name=None, stage=True):
        import libvirt

        self.conn = conn
        self.image = image
        self.name = name or f"{PREFIX}{os.getpid()}"
        self.path = STATE / "pools" / self.name
        self.path.mkdir(parents=True, exist_ok=True)
        # qemu runs as libvirt-qemu: it must reach the files (libvirt chowns the images it uses).
        for p in (STATE, STATE / "pools", self.path):
            p.chmod(0o755)
        with contextlib.suppress(libvirt.libvirtError):
            conn.storagePoolLookupByName(self.name).destroy()
        xml = f"<pool type='dir'><name>{self.name}</name><target><path>{self.path}</path></target></pool>"
        self.pool = conn.storagePoolCreateXML(xml, 0)
        # stage=False: an empty pool, for vclmgr's own driver to stage the image into.
        self.base = self.stage("disk.qcow2", "base.qcow2") if stage else None

    def stage(self, src_name, dst_name):
        """Copy a file of the image into the pool once (what a driver's stage_image does)."""
        dst = self.path / dst_name
        if not dst.exists():
            tmp = dst.with_suffix(".part")
            with open(self.image["dir"] / src_name, "rb") as src, open(tmp, "wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
            tmp.chmod(0o644)
            tmp.rename(dst)
            self.pool.refresh(0)
        return dst

    def volumes(self):
        self.pool.refresh(0)
        return sorted(v.name() for v in self.pool.listAllVolumes())

    def overlay(self, name):
        xml = (
            f"<volume><name>{name}</name><capacity unit='MiB'>64</capacity>"
            "<target><format type='qcow2'/></target>"
            f"<backingStore><path>{self.base}</path><format type='qcow2'/></backingStore></volume>"
        )
        return self.pool.createXML(xml, 0)

    def upload(self, name, data):
        xml = (
            f"<volume><name>{name}</name><capacity unit='B'>{len(data)}</capacity>"
            "<target><format type='raw'/></target></volume>"
        )
        vol = self.pool.createXML(xml, 0)
        stream = self.conn.newStream(0)
        vol.upload(stream, 0, len(data), 0)
        for at in range(0, len(data), 1 << 18):
            stream.send(data[at : at + (1 << 18)])
        stream.finish()
        return vol

    def close(self):
        import libvirt

        with contextlib.suppress(libvirt.libvirtError):
            self.pool.destroy()
        for f in self.path.glob("*"):
            f.unlink()
        self.path.rmdir()


# --- guests ----------------------------------------------------------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def domain_xml(name, disk, seed, port, console_log, image=None, boot="disk", memory_mib=256, networks=()):
    """A guest of the test image: ``boot='disk'`` (SYSLINUX from the qcow2) or ``'kernel'``
    (direct boot of the uncompressed kernel + initramfs staged beside it, ``image['kernel_files']``).
    ``networks``: ``(libvirt network, MAC)`` pairs, one more virtio NIC on each."""
    if boot == "kernel":
        kernel, initrd = image["kernel_files"]
        os_boot = f"<kernel>{kernel}</kernel><initrd>{initrd}</initrd><cmdline>{image['cmdline']}</cmdline>"
    else:
        os_boot = "<boot dev='hd'/>"
    nics = "".join(
        f"<interface type='network'><source network='{net}'/><mac address='{mac}'/><model type='virtio'/></interface>"
        for net, mac in networks
    )
    return f"""<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>{name}</name>
  <memory unit='MiB'>{memory_mib}</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type>{os_boot}</os>
  <features><acpi/></features>
  <clock offset='utc'/>
  <on_poweroff>destroy</on_poweroff>
  <on_crash>destroy</on_crash>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/><source file='{disk}'/><target dev='vda' bus='virtio'/>
    </disk>
    <disk type='file' device='cdrom'>
      <driver name='qemu' type='raw'/><source file='{seed}'/><target dev='hdc' bus='ide'/><readonly/>
    </disk>
    <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>
    <serial type='pty'><log file='{console_log}' append='off'/><target port='0'/></serial>
    <memballoon model='none'/>{nics}
  </devices>
  <qemu:commandline>
    <qemu:arg value='-netdev'/>
    <qemu:arg value='user,id=vclnet0,restrict=on,hostfwd=tcp:127.0.0.1:{port}-:22'/>
    <qemu:arg value='-device'/>
    <qemu:arg value='virtio-net-pci,netdev=vclnet0,addr=0x10'/>
  </qemu:commandline>
</domain>"""


@dataclass
class Guest:
    name: str
    port: int
    dom: object
    console_log: Path
    volumes: list = field(default_factory=list)
    started: float = 0.0

    def console(self):
        try:
            return self.console_log.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self):
        return f"\n--- console of {self.name} ---\n{self.console()[-2000:]}"

    def wait_agent(self, timeout=180):
        import libvirt
        import libvirt_qemu

        deadline = time.monotonic() + timeout
        while True:
            try:
                libvirt_qemu.qemuAgentCommand(self.dom, '{"execute":"guest-ping"}', 2, 0)
                return time.monotonic() - self.started
            except libvirt.libvirtError as exc:
                if time.monotonic() > deadline:
                    raise RealVMError(f"{self.name}: no guest agent after {timeout}s ({exc}){self.tail()}") from None
                if not self.dom.isActive():
                    raise RealVMError(f"{self.name}: domain stopped while booting{self.tail()}") from None
            time.sleep(0.1)

    def wait_ssh(self, timeout=180):
        """Until the guest's SSH server sends its banner through the forward (slirp accepts
        the TCP connection itself, so a connect alone proves nothing)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                s.settimeout(2)
                if s.recv(64).startswith(b"SSH-"):
                    return time.monotonic() - self.started
            time.sleep(0.1)
        raise RealVMError(f"{self.name}: no SSH banner on 127.0.0.1:{self.port} after {timeout}s{self.tail()}")


def start_guest(pool, name, seed_iso, boot="disk", attempts=3, networks=()):
    """Define and start a guest of the pool's image with ``seed_iso`` as its CD-ROM (and a NIC
    on each of ``networks``, see ``domain_xml``). The caller removes it with ``remove_guest``
    (also when this raises: it cleans up what it made)."""
    import libvirt

    disk = pool.overlay(f"{name}.qcow2")
    seed = pool.upload(f"{name}-seed.iso", seed_iso)
    guest = Guest(name=name, port=0, dom=None, console_log=pool.path / f"{name}.console.log", volumes=[disk, seed])
    image = dict(pool.image)
    if boot == "kernel":
        image["kernel_files"] = (pool.stage("vmlinux", "vmlinux"), pool.stage("initrd", "initrd"))
    try:
        for attempt in range(attempts):
            guest.port = free_port()
            xml = domain_xml(
                name, disk.path(), seed.path(), guest.port, guest.console_log, image, boot, networks=networks
            )
            guest.dom = pool.conn.defineXML(xml)
            guest.started = time.monotonic()
            try:
                guest.dom.create()
                return guest
            except libvirt.libvirtError as exc:
                # Another process may have taken the port between free_port() and QEMU's bind.
                port_taken = "forward" in str(exc).lower() or "hostfwd" in str(exc).lower()
                if not port_taken or attempt == attempts - 1:
                    raise
                guest.dom.undefine()
                guest.dom = None
    except BaseException:
        remove_guest(pool, guest)
        raise
    raise AssertionError("unreachable")


def remove_domains_on(conn, paths):
    """Destroy and undefine every domain with a disk under ``paths`` (a test's pools), saved
    memory and snapshot metadata included. The xdist workers share the daemon: a domain another
    worker removes while this one lists them is skipped, not an error."""
    import libvirt

    flags = libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
    for dom in conn.listAllDomains():
        try:
            if not any(str(path) in dom.XMLDesc(0) for path in paths):
                continue
            with contextlib.suppress(libvirt.libvirtError):  # not running (its QEMU killed by a test)
                dom.destroy()
            dom.undefineFlags(flags)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                raise


def remove_guest(pool, guest):
    import libvirt

    if guest.dom is not None:
        with contextlib.suppress(libvirt.libvirtError):
            guest.dom.destroy()
        with contextlib.suppress(libvirt.libvirtError):
            guest.dom.undefine()
    for vol in guest.volumes:
        with contextlib.suppress(libvirt.libvirtError):
            vol.delete(0)
    guest.console_log.unlink(missing_ok=True)


@contextlib.contextmanager
def booted_guest(pool, name, seed_iso, boot="disk"):
    guest = start_guest(pool, name, seed_iso, boot)
    try:
        yield guest
    finally:
        remove_guest(pool, guest)


# --- private networks: a range no interface of this machine uses ----------------------------


def remove_network(conn, key):
    """Stop and undefine the libvirt network ``key`` (nothing when it is gone already)."""
    import libvirt

    with contextlib.suppress(libvirt.libvirtError):
        net = conn.networkLookupByName(key)
        if net.isActive():
            net.destroy()
        net.undefine()


def ip_json(*args):
    """``ip -j ARGS`` parsed ([] when it fails or says nothing)."""
    done = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, timeout=30, check=False)
    return json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else []


def unused_range(avoid=()):
    """A /29 of 192.168.250.0/24 that no interface here has an address in (nor overlaps a
    range of ``avoid``), tried from one that depends on this process (xdist workers asking at
    once start at different ones)."""
    used = [
        ipaddress.ip_interface(f"{a['local']}/{a['prefixlen']}").network
        for link in ip_json("addr")
        for a in link.get("addr_info", [])
    ] + [ipaddress.ip_network(cidr) for cidr in avoid]
    candidates = list(ipaddress.IPv4Network("192.168.250.0/24").subnets(new_prefix=29))
    first = os.getpid() % len(candidates)
    for candidate in candidates[first:] + candidates[:first]:
        if not any(candidate.overlaps(net) for net in used if net.version == 4):
            return str(candidate)
    raise AssertionError("every /29 of 192.168.250.0/24 is in use on this machine")


# --- a reservation's login, and logging in with it ------------------------------------------


def new_login():
    """A random login with a fresh ed25519 key and a random password, like a reservation's."""
    private = Ed25519PrivateKey.generate()
    public = private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    suffix = secrets.token_hex(4)
    return {
        "login": f"u{suffix}",
        "hostname": f"vm-{suffix}",
        "password": secrets.token_urlsafe(16),
        "pkey": paramiko.Ed25519Key.from_private_key(io.StringIO(pem.decode())),
        "public": f"{public.decode()} test@vclmgr",
    }


def seed_for(user):
    guest = cloudinit.GuestLogin(
        instance_id=f"i-{user['login']}",
        hostname=user["hostname"],
        login=user["login"],
        password_hash=cloudinit.password_hash(user["password"]),
        ssh_keys=(user["public"],),
    )
    return cloudinit.seed_iso(cloudinit.seed_files(guest))


def ssh_client(port, login, host="127.0.0.1", sock=None, **auth):
    """A connected paramiko client for ``login`` on a guest (``auth``: its ``pkey`` or
    ``password``; ``sock``: a way in other than a connection from here), with the waits a guest
    booting under software emulation needs."""
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # a fresh guest: its host key is new
    client.connect(
        host,
        port=port,
        username=login,
        sock=sock,
        timeout=30,
        banner_timeout=60,
        auth_timeout=60,
        allow_agent=False,
        look_for_keys=False,
        **auth,
    )
    return client


def ssh_run(port, login, command, host="127.0.0.1", **auth):
    client = ssh_client(port, login, host, **auth)
    try:
        _, stdout, stderr = client.exec_command(command, timeout=60)
        out = stdout.read().decode()
        assert stdout.channel.recv_exit_status() == 0, stderr.read().decode()
        return out
    finally:
        client.close()
