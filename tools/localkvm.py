"""A private libvirtd + QEMU on this machine, and the test guest image, for everything that
wants a real hypervisor without touching a system one: the integration tests
(``tests/realvm.py`` adds guests and logins), ``bench/real_vm.py`` and ``manage.py kvm_demo``
(``make run-kvm``). No pytest and no Django models in here.

The daemon (``Libvirtd``) is shared by everything that runs on this machine at once (xdist
workers, a bench, a second test run, the demo server): the first user starts
``virtlogd -d -p`` and ``libvirtd -d -p -f`` under a file lock, each user registers its PID,
and the last one to leave destroys the test domains that are left and stops exactly those two
processes by PID. The daemon's sockets live in a private directory
(``qemu:///system?socket=…``), so nothing here talks to a system libvirtd; and since two
system-mode daemons would share ``/run/libvirt/qemu``, a libvirtd that is not ours makes
``acquire`` fail with a clear message rather than run beside it (one in another mount
namespace has a ``/run/libvirt`` of its own: ``tests/twohosts.py``'s, a container's).
"""

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STATE = Path(os.environ.get("VCLMGR_LIBVIRTD_DIR", Path(tempfile.gettempdir()) / "vclmgr-libvirtd"))
PREFIX = "vclmgr-test-"
DAEMONS = ("libvirtd", "virtqemud")
#: The daemon's program; another one (a build of its own, a stand-in in the reaper's test) by
#: VCLMGR_LIBVIRTD. Ours are told apart by their pid files and program names.
LIBVIRTD = os.environ.get("VCLMGR_LIBVIRTD", "libvirtd")
PROGRAMS = {"libvirtd": Path(LIBVIRTD).name, "virtlogd": "virtlogd"}


class RealVMError(RuntimeError):
    pass


# --- processes -----------------------------------------------------------------------------


def _exe_name(pid):
    try:
        return Path(os.readlink(f"/proc/{pid}/exe")).name
    except OSError:
        return None


def _read_pid(path):
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _mount_ns(pid):
    try:
        return os.stat(f"/proc/{pid}/ns/mnt").st_ino
    except OSError:
        return None


def _running(names):
    """The processes of these programs in this mount namespace: a daemon in another one (the
    two hosts of the live-migration tests, a container) has its own ``/run/libvirt``."""
    found, ours = [], _mount_ns("self")
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _exe_name(entry.name) in names and _mount_ns(entry.name) == ours:
            found.append(int(entry.name))
    return found


def _stop_pid(pid, name, timeout=15):
    """SIGTERM the process ``pid`` if it still is ``name``, then SIGKILL after ``timeout``."""
    if pid is None or _exe_name(pid) != name:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _exe_name(pid) != name:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def _locked():
    STATE.mkdir(parents=True, exist_ok=True)
    with open(STATE / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


class Libvirtd:
    """The shared private daemon; ``acquire()`` → an instance with ``uri``; ``release()``."""

    def __init__(self):
        self.sock_dir = STATE / "sock"
        self.uri = f"qemu:///system?socket={self.sock_dir}/libvirt-sock"
        # One registration per acquire: <pid>, and <pid>.<n> for a process's further ones (a
        # test session and the kvm_demo command it runs), so a dead process's are found.
        self.user = STATE / "users" / str(os.getpid())

    def trust_socket(self):
        """vclmgr accepts ``?socket=`` in a libvirt URI only for sockets the operator lists in
        ``VCLMGR_LIBVIRT_SOCKETS``: list ours, for this process and the workers it starts."""
        path = str(self.sock_dir / "libvirt-sock")
        os.environ["VCLMGR_LIBVIRT_SOCKETS"] = path
        from django.conf import settings

        if settings.configured:
            settings.VCLMGR_LIBVIRT_SOCKETS = [path]

    # pids of the processes we started (None when not running)
    def _ours(self, name):
        pid = _read_pid(STATE / f"{name}.pid")
        return pid if pid is not None and _exe_name(pid) == PROGRAMS[name] else None

    def _stop(self, name):
        _stop_pid(self._ours(name), PROGRAMS[name])

    @classmethod
    def acquire(cls, timeout=120):
        import libvirt

        # Polling the guest agent fails until it is up; libvirt would print each failure.
        libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
        self = cls()
        self.trust_socket()
        with _locked():
            if self._ours("libvirtd") is None:
                self._start(timeout)
            self.user.parent.mkdir(exist_ok=True)
            if self.user.exists():
                self.user = self.user.with_name(f"{os.getpid()}.{id(self)}")
            self.user.touch()
        return self

    def release(self, also=()):
        """Leave; the last user out also destroys the domains named ``PREFIX…`` (and ``also…``)."""
        with _locked():
            self.user.unlink(missing_ok=True)
            if not self._live_users():
                self._shut_down(also)

    def _shut_down(self, also=()):
        # (under the lock)
        self._destroy_leftovers((PREFIX, *also))
        self._stop("libvirtd")
        self._stop("virtlogd")
        # Pools of users that died before closing them (each holds a copy of the image).
        shutil.rmtree(STATE / "pools", ignore_errors=True)

    def reap(self, every=1.0):
        """Wait until the daemon is gone or its last user died, and then shut it down.

        Started with the daemon, in a session of its own: a user killed before it could
        release (an xdist worker killed on Ctrl-C, a SIGKILL) must not leave the daemon and
        its guests running."""
        while True:
            time.sleep(every)
            with _locked():
                if self._ours("libvirtd") is None:
                    self._stop("virtlogd")
                    return
                if not self._live_users():
                    self._shut_down()
                    return

    def _live_users(self):
        live = []
        for f in (STATE / "users").glob("*"):
            if Path(f"/proc/{f.name.split('.')[0]}").exists():
                live.append(f.name)
            else:  # a user that died without releasing
                f.unlink(missing_ok=True)
        return live

    def _start(self, timeout):
        foreign = _running(DAEMONS)
        if foreign:
            raise RealVMError(
                f"a libvirt daemon not started by the tests is running (pid {foreign}); the tests run their "
                "own private libvirtd and will not share /run/libvirt/qemu with it: stop it first"
            )
        for f in ("libvirtd.pid", "virtlogd.pid"):
            (STATE / f).unlink(missing_ok=True)
        self.sock_dir.mkdir(parents=True, exist_ok=True)
        conf = STATE / "libvirtd.conf"
        conf.write_text(
            f'unix_sock_dir = "{self.sock_dir}"\n'
            'auth_unix_ro = "none"\nauth_unix_rw = "none"\n'
            f'log_outputs = "3:file:{STATE}/libvirtd.log"\n'
        )
        # A virtlogd someone else runs serves us as well; we only stop the one we start.
        if not _running(("virtlogd",)):
            subprocess.run(["virtlogd", "-d", "-p", str(STATE / "virtlogd.pid")], check=True, timeout=30)
        subprocess.run([LIBVIRTD, "-d", "-p", str(STATE / "libvirtd.pid"), "-f", str(conf)], check=True, timeout=30)
        with open(STATE / "reaper.log", "ab") as log:
            subprocess.Popen(  # noqa: S603 (this file, fixed arguments)
                [sys.executable, str(Path(__file__).resolve()), "reap"],
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                cwd=ROOT,
            )
        import libvirt

        deadline = time.monotonic() + timeout
        while True:
            try:
                conn = libvirt.open(self.uri)
                conn.getCapabilities()  # the first start probes QEMU (~10 s)
                conn.close()
                return
            except libvirt.libvirtError as exc:
                gone = self._ours("libvirtd") is None and time.monotonic() > deadline - timeout + 10
                if gone or time.monotonic() > deadline:
                    log_file = STATE / "libvirtd.log"
                    log = log_file.read_text(errors="replace")[-2000:] if log_file.exists() else ""
                    self._stop("libvirtd")
                    self._stop("virtlogd")
                    raise RealVMError(f"libvirtd did not answer on {self.uri}: {exc}\n{log}") from None
                time.sleep(0.2)

    def _destroy_leftovers(self, prefixes):
        import libvirt

        try:
            conn = libvirt.open(self.uri)
        except libvirt.libvirtError:
            return
        try:
            for dom in conn.listAllDomains():
                if dom.name().startswith(prefixes):
                    with contextlib.suppress(libvirt.libvirtError):
                        dom.destroy()
                    with contextlib.suppress(libvirt.libvirtError):
                        dom.undefine()
            for pool in conn.listAllStoragePools():
                if pool.name().startswith(PREFIX):
                    with contextlib.suppress(libvirt.libvirtError):
                        pool.destroy()
        finally:
            conn.close()


# --- the guest image -------------------------------------------------------------------------


def guest_image():
    """Build (or find cached) the test guest; → dict with absolute paths and the cmdline."""
    build = subprocess.run(
        [sys.executable, str(ROOT / "tools/guest-image/build.py")], capture_output=True, text=True, timeout=900
    )
    if build.returncode:
        raise RealVMError(f"tools/guest-image/build.py failed:\n{build.stderr[-3000:]}")
    path = Path(build.stdout.split()[-1])
    info = json.loads((path / "guest.json").read_text())
    info["dir"] = path
    return info


if __name__ == "__main__" and sys.argv[1:] == ["reap"]:
    Libvirtd().reap()
