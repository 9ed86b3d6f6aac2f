"""Two KVM hosts on this machine, for what moves running guests between hosts (live migration,
evacuation, balancing): two private libvirtd daemons, each in a network, mount and UTS
namespace of its own, so libvirt sees two machines. No pytest and no Django in here.

Each host has its own host name (UTS namespace), host UUID (``host_uuid`` in its
``libvirtd.conf``; libvirt refuses a migration between two daemons with the same one), socket
directory, and its own ``/etc/libvirt``, ``/var/lib/libvirt``, ``/var/cache/libvirt``,
``/var/log/libvirt`` and ``/run/libvirt`` (bind mounts of directories under ``root``, in its
mount namespace): the domain definitions, QEMU's monitors and logs of one are not the other's.
The daemons are reached through their sockets (``qemu:///system?socket=…``), which are
outside the namespaces. QEMU writes its logs itself (``stdio_handler = "file"``: no virtlogd)
and gets no cgroups (``cgroup_controllers = []``: two daemons would make the same cgroup for a
domain that is on both during a migration).

Network rule: the two network namespaces are the test's own and hold the only network either
host sees, one L2 segment ``NET`` (a bridge ``br0`` in each, joined by a veth pair; no route
out, no forwarding; ``mtu``: the segment's, for an overlay carried over it). The hosts' own
addresses on it carry the migration streams (``migration_host``), the guests' NICs attach to
the bridges, and a dnsmasq in host A's namespace gives them addresses: a guest keeps its
address and its TCP connections when it moves. The test reaches a guest from a process in a
host's namespace (``ip netns exec … nc``, ``proxy``).

``hooks(host, peer)`` gives each host's libvirt hook scripts (``{"network": text}``: what an
operator puts in ``/etc/libvirt/hooks``), written into its own ``/etc/libvirt/hooks`` before
its daemon starts (libvirtd looks for them once, at start). They run as the daemon's children,
in its namespaces.

Every process here is stopped by PID: the daemons, the dnsmasq, and each process left in a
host's network namespace (its QEMUs) — also for a host whose libvirtd a test killed
(``kill_libvirtd``; ``restart`` brings the host back).
"""

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

NET = "10.250.0"  # /24, inside the test's namespaces only
BRIDGE = "br0"
SHARED_POOL, LOCAL_POOL = "shared", "local"
LIBVIRT_DIRS = {  # (under the host's directory, mounted over)
    "etc": "/etc/libvirt",
    "lib": "/var/lib/libvirt",
    "cache": "/var/cache/libvirt",
    "log": "/var/log/libvirt",
    "run": "/run/libvirt",
}


class TwoHostsError(RuntimeError):
    pass


def _run(*argv, timeout=30):
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode:
        raise TwoHostsError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def _netns_inode(name):
    return os.stat(f"/run/netns/{name}").st_ino


def _pids_in_netns(name):
    """The processes in the network namespace ``name`` (the test's: all of them are ours)."""
    try:
        inode = _netns_inode(name)
    except OSError:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if os.stat(entry / "ns/net").st_ino == inode:
                    found.append(int(entry.name))
    return found


def _exe(pid):
    try:
        return Path(os.readlink(f"/proc/{pid}/exe")).name
    except OSError:
        return ""


def _stop(pid, timeout=10, sig=signal.SIGTERM):
    """``sig`` to ``pid``, then SIGKILL after ``timeout``; waits until it is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # (our own child: reap it, or it stays a zombie)
        if not Path(f"/proc/{pid}").exists() or _zombie(pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _zombie(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


@dataclass
class Host:
    name: str  # its host name, and the hypervisor's name in vclmgr
    netns: str
    address: str  # on NET
    dir: Path
    uuid: str
    process: subprocess.Popen = None

    @property
    def socket(self):
        return self.dir / "sock" / "libvirt-sock"

    @property
    def uri(self):
        return f"qemu:///system?socket={self.socket}"

    @property
    def log(self):
        return self.dir / "libvirtd.log"

    def alive(self):
        return self.process is not None and self.process.poll() is None

    def qemus(self):
        """This host's QEMU processes (also those a killed libvirtd left)."""
        return [pid for pid in _pids_in_netns(self.netns) if _exe(pid).startswith("qemu-system-")]


class TwoHosts:
    """``TwoHosts().start()`` → ``.a``, ``.b`` (``Host``), ``.shared`` (a directory both see);
    ``stop()`` ends it all. Each host has two storage pools: ``shared`` (that directory) and
    ``local`` (``local_pool``: the same path on both, a directory of each host's own, as on two
    machines)."""

    local_pool = "/var/lib/libvirt/images/vclmgr"

    def __init__(self, root=None, *, hooks=None, mtu=1500):
        tag = f"vclmgr-2h-{os.getpid()}"
        self.hooks, self.mtu = hooks, mtu
        self.root = Path(root or Path(tempfile.gettempdir()) / tag)
        self.shared = self.root / "shared"
        self.a = self._host("host-a", f"{tag}-a", f"{NET}.1")
        self.b = self._host("host-b", f"{tag}-b", f"{NET}.2")
        self.dnsmasq = None

    def _host(self, name, netns, address):
        return Host(name, netns, address, self.root / name, str(uuid.uuid4()))

    @property
    def hosts(self):
        return (self.a, self.b)

    # --- start -------------------------------------------------------------------------------

    def start(self, timeout=120):
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            for path in (self.root, self.shared):
                path.mkdir(exist_ok=True)
                path.chmod(0o755)  # QEMU runs as libvirt-qemu
            self._network()
            self._start_dnsmasq()
            self._start_daemon(self.a, timeout)
            # The QEMU capabilities B would probe again (~10 CPU-seconds): A's, as a cache.
            shutil.copytree(self.a.dir / "cache" / "qemu", self.b.dir / "cache" / "qemu", dirs_exist_ok=True)
            self._start_daemon(self.b, timeout)
            for host in self.hosts:
                self._pools(host)
        except BaseException:
            self.stop()
            raise
        return self

    def _network(self):
        """One L2 segment across both namespaces: ``br0`` in each, a veth pair between them."""
        for host in self.hosts:
            _run("ip", "netns", "add", host.netns)
        _run("ip", "-n", self.a.netns, *"link add veth0 type veth peer name veth0 netns".split(), self.b.netns)
        for host in self.hosts:
            ns = ("ip", "-n", host.netns)
            _run(*ns, "link", "add", BRIDGE, "type", "bridge", "stp_state", "0", "forward_delay", "0")
            _run(*ns, "link", "set", "veth0", "master", BRIDGE, "mtu", str(self.mtu))
            _run(*ns, "link", "set", BRIDGE, "mtu", str(self.mtu))
            _run(*ns, "addr", "add", f"{host.address}/24", "dev", BRIDGE)
            for link in ("lo", "veth0", BRIDGE):
                _run(*ns, "link", "set", link, "up")

    def _start_dnsmasq(self):
        leases = self.root / "dnsmasq.leases"
        with open(self.root / "dnsmasq.log", "wb") as log:
            self.dnsmasq = self._spawn(
                log,
                [
                    *("ip", "netns", "exec", self.a.netns, "dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null"),
                    *("--port=0", f"--interface={BRIDGE}", "--bind-interfaces", "--except-interface=lo"),
                    *(f"--dhcp-range={NET}.100,{NET}.199,255.255.255.0,1h", f"--dhcp-leasefile={leases}"),
                    *(f"--pid-file={self.root / 'dnsmasq.pid'}", "--dhcp-authoritative", "--log-facility=-"),
                ],
            )

    @staticmethod
    def _spawn(log, argv):
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)  # noqa: S603

    def _configure(self, host):
        # Empty state directories (libvirtd makes and chowns what it needs), and the system's
        # configuration files only: not the definitions of domains and networks under /etc/libvirt
        # (a daemon already running here, the tests' shared one, keeps its own there).
        for sub in LIBVIRT_DIRS:
            (host.dir / sub).mkdir(parents=True, exist_ok=True)
            (host.dir / sub).chmod(0o755)
        for conf in Path("/etc/libvirt").glob("*.conf"):
            shutil.copy(conf, host.dir / "etc" / conf.name)
        (host.dir / "lib" / "images" / "vclmgr").mkdir(parents=True, exist_ok=True)
        (host.dir / "sock").mkdir(exist_ok=True)
        host.dir.chmod(0o755)
        peer = self.b if host is self.a else self.a
        for name, text in (self.hooks(host, peer) if self.hooks else {}).items():
            (host.dir / "etc" / "hooks").mkdir(exist_ok=True)
            script = host.dir / "etc" / "hooks" / name
            script.write_text(text)
            script.chmod(0o755)
        (host.dir / "etc" / "qemu.conf").write_text(
            'stdio_handler = "file"\n'
            "cgroup_controllers = [ ]\n"
            f'migration_address = "{host.address}"\n'
            f'migration_host = "{host.address}"\n'
        )
        conf = host.dir / "libvirtd.conf"
        conf.write_text(
            f'unix_sock_dir = "{host.dir / "sock"}"\n'
            'auth_unix_ro = "none"\nauth_unix_rw = "none"\n'
            f'host_uuid = "{host.uuid}"\n'
            f'log_outputs = "3:file:{host.log}"\n'
        )
        return conf

    def _start_daemon(self, host, timeout):
        conf = self._configure(host)
        Path("/run/libvirt").mkdir(exist_ok=True)  # (a mount point; the shared test daemon makes it too)
        mounts = "".join(f"mount --bind {host.dir / sub} {path}\n" for sub, path in LIBVIRT_DIRS.items())
        script = f"hostname {host.name}\n{mounts}exec libvirtd -f {conf} -p {host.dir / 'libvirtd.pid'}\n"
        argv = [
            "ip",
            "netns",
            "exec",
            host.netns,
            *"unshare --mount --uts --propagation private sh -ec".split(),
            script,
        ]
        with open(host.dir / "stderr.log", "wb") as log:
            host.process = self._spawn(log, argv)
        self._wait_answers(host, timeout)

    def _wait_answers(self, host, timeout):
        import libvirt

        libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
        deadline = time.monotonic() + timeout
        while True:
            try:
                conn = libvirt.open(host.uri)
                try:
                    conn.getCapabilities()
                    return
                finally:
                    conn.close()
            except libvirt.libvirtError as exc:
                if not host.alive() or time.monotonic() > deadline:
                    why = f"{host.name}: libvirtd did not answer on {host.uri}: {exc}\n{self.logs(host)}"
                    raise TwoHostsError(why) from None
                time.sleep(0.2)

    def _pools(self, host):
        """``shared`` (``self.shared``, the same directory on both) and ``local`` (the host's own)."""
        import libvirt

        conn = libvirt.open(host.uri)
        try:
            for name, path in ((SHARED_POOL, self.shared), (LOCAL_POOL, self.local_pool)):
                conn.storagePoolCreateXML(
                    f"<pool type='dir'><name>{name}</name><target><path>{path}</path></target></pool>", 0
                )
        finally:
            conn.close()

    def logs(self, host):
        out = []
        for path in (host.dir / "stderr.log", host.log):
            with contextlib.suppress(OSError):
                out.append(f"--- {path.name} ---\n{path.read_text(errors='replace')[-2000:]}")
        return "\n".join(out)

    # --- inside -----------------------------------------------------------------------------

    def proxy(self, host, address, port=22):
        """A command line that connects to ``address:port`` on the segment from ``host``'s
        namespace (for ``paramiko.ProxyCommand``: an SSH session to a guest)."""
        return f"ip netns exec {host.netns} nc {address} {port}"

    def ssh(self, host, address, login, **auth):
        """An SSH session to the guest at ``address`` from ``host``'s namespace (vclmgr's own
        process is outside it); ``auth``: its ``pkey`` or ``password``."""
        import paramiko

        from tests.realvm import ssh_client

        return ssh_client(22, login, address, sock=paramiko.ProxyCommand(self.proxy(host, address)), **auth)

    # --- failures and stop --------------------------------------------------------------------

    def kill_libvirtd(self, host):
        """``host``'s libvirtd dies (SIGKILL, by PID); its QEMUs go on as they would."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(host.process.pid, signal.SIGKILL)
        host.process.wait(timeout=30)

    def restart(self, host, timeout=120):
        """``host`` comes back as after a reboot: any QEMU left killed (by PID), its libvirtd
        started again with its pools (its definitions are kept, as on a disk)."""
        if host.alive():
            _stop(host.process.pid)
            host.process.wait(timeout=30)
        for pid in host.qemus():
            _stop(pid, timeout=5, sig=signal.SIGKILL)
        shutil.rmtree(host.dir / "run")  # (a reboot empties /run: the transient pools, the domains' status)
        self._start_daemon(host, timeout)
        self._pools(host)

    def stop(self):
        """Everything ends: each host's domains destroyed, its libvirtd stopped and any process
        left in its namespace killed (by PID), the dnsmasq, the namespaces and the directories."""
        for host in self.hosts:
            with contextlib.suppress(Exception):
                self._destroy_domains(host)
            if host.process is not None:
                _stop(host.process.pid)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    host.process.wait(timeout=5)
        if self.dnsmasq is not None:
            _stop(self.dnsmasq.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.dnsmasq.wait(timeout=5)
        for host in self.hosts:
            for pid in _pids_in_netns(host.netns):  # QEMUs of a killed libvirtd; nothing else is in there
                _stop(pid, timeout=5, sig=signal.SIGKILL)
            with contextlib.suppress(TwoHostsError):
                _run("ip", "netns", "del", host.netns)
        shutil.rmtree(self.root, ignore_errors=True)

    def _destroy_domains(self, host):
        import libvirt

        if not host.alive():
            return
        conn = libvirt.open(host.uri)
        try:
            for dom in conn.listAllDomains():
                with contextlib.suppress(libvirt.libvirtError):
                    dom.destroy()
                with contextlib.suppress(libvirt.libvirtError):
                    dom.undefineFlags(
                        libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
                    )
        finally:
            conn.close()
