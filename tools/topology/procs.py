"""Processes on the namespace machines: PostgreSQL, Redis, haproxy and vclmgr's roles.

Each is started with ``ip netns exec <ns>`` (which execs: the Popen pid is the process's own)
and stopped by its pid; ``Cluster.close`` then SIGKILLs by pid whatever still runs in a
machine's namespace. If the run's own process dies before it can (SIGKILL, a CI timeout), its
processes go too: each asks the kernel for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``,
``core.lifeline``), and vclmgr's ``serve`` also holds the run's lifeline pipe, so that its own
children follow it. PDEATHSIG fires when the *thread* that forked ends, so every process is
forked by one thread that lives as long as the run's process (``_Spawner``), whichever thread
asks (the fault and supervisor threads restart machines).

PostgreSQL runs as the ``postgres`` user (``setpriv``, which also execs), from ``initdb`` in a
private directory, started and stopped with ``pg_ctl`` and known by the pid in its
``postmaster.pid``.
"""

import os
import pwd
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from core import lifeline
from core.lifeline import pid_alive

ROOT = Path(__file__).resolve().parents[2]
PG_BIN = Path("/usr/lib/postgresql/15/bin")
PG_PORT, REDIS_PORT, WEB_PORT, LB_PORT = 5432, 6379, 8000, 8000


def wait_until(predicate, timeout, what, interval=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout}s waiting for {what}")


def stop_pid(pid, sig=signal.SIGTERM, timeout=15):
    """Signal one process, wait for it to go, SIGKILL it past ``timeout``."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:  # not our child: poll for it
            if not pid_alive(pid):
                return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


class _Spawner:
    """One long-lived thread that forks every process of the run (see the module's docstring)."""

    def __init__(self):
        self.requests = queue.Queue()
        self.pipe = None
        threading.Thread(target=self._serve, name="topology-spawner", daemon=True).start()

    def _serve(self):
        while True:
            kwargs, answer = self.requests.get()
            try:
                answer.put((subprocess.Popen(**kwargs), None))
            except BaseException as exc:  # noqa: BLE001 (handed to the caller)
                answer.put((None, exc))

    def lifeline(self):
        """The run's lifeline pipe ``(read_fd, env value)``: its write end is held until exit."""
        if self.pipe is None:
            read_fd, _write_fd, value = lifeline.open_pipe()
            self.pipe = (read_fd, value)
        return self.pipe

    def popen(self, args, *, lifeline_pipe=False, **kwargs):
        kwargs.update(args=args, preexec_fn=lifeline.preexec(os.getpid()))
        if lifeline_pipe:
            read_fd, value = self.lifeline()
            kwargs["pass_fds"] = (read_fd,)
            kwargs["env"] = {**kwargs["env"], lifeline.ENV: value}
        answer = queue.Queue()
        self.requests.put((kwargs, answer))
        proc, error = answer.get()
        if error is not None:
            raise error
        return proc


_spawner = None
_spawner_lock = threading.Lock()


def spawner():
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = _Spawner()
    return _spawner


class Proc:
    """A process in a namespace, its output in ``log_path``; ``lifeline_pipe``: it inherits the
    run's lifeline (vclmgr's processes watch it and stop their own children when it closes)."""

    def __init__(self, ns, args, log_path, env=None, user=None, lifeline_pipe=False):
        self.log_path = Path(log_path)
        self.log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop)
        prefix = ["ip", "netns", "exec", ns]
        if user:  # (setpriv's change of user clears PDEATHSIG; pg_ctl's postgres is stopped by close)
            prefix += ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--"]
        self.proc = spawner().popen(
            [*prefix, *args],
            cwd=ROOT,
            env=env or dict(os.environ),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            lifeline_pipe=lifeline_pipe,
        )
        self.pid = self.proc.pid

    def alive(self):
        return self.proc.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout=15):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def tail(self, chars=3000):
        return self.log_path.read_text(errors="replace")[-chars:]


def run_in(ns, args, env=None, timeout=60, user=None):
    prefix = ["ip", "netns", "exec", ns]
    if user:
        prefix += ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--"]
    return subprocess.run(
        [*prefix, *args], cwd=ROOT, env=env or dict(os.environ), capture_output=True, text=True, timeout=timeout
    )


# --- the database machine ----------------------------------------------------------------


class Postgres:
    """A private cluster, listening on the machine's address only.

    Its files are in a directory of their own under /tmp (the postgres user must reach them,
    and a test's tmp_path is root's alone), removed by ``stop``; its log is copied to ``workdir``.
    """

    def __init__(self, ns, address, workdir, max_connections=300):
        self.ns, self.address = ns, address
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix="vclmgr-topology-pg-"))
        os.chmod(self.root, 0o755)
        self.dir = self.root / "data"
        self.sockets = self.root / "sockets"
        self.log = self.root / "postgres.log"
        pg = pwd.getpwnam("postgres")
        for path in (self.dir, self.sockets):
            path.mkdir(mode=0o700)
            os.chown(path, pg.pw_uid, pg.pw_gid)
        self.log.touch()
        os.chown(self.log, pg.pw_uid, pg.pw_gid)
        out = run_in(
            ns,
            [
                str(PG_BIN / "initdb"),
                "-D",
                str(self.dir),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ],
            user="postgres",
            timeout=120,
        )
        if out.returncode:
            raise RuntimeError(f"initdb failed: {out.stderr}")
        with open(self.dir / "pg_hba.conf", "a") as hba:
            # Only the machines of this namespace network reach it; a test cluster.
            hba.write("host all all 10.77.0.0/24 trust\n")
        self.options = (
            f"-c listen_addresses={address} -c port={PG_PORT} -c unix_socket_directories={self.sockets} "
            f"-c max_connections={max_connections} -c fsync=off -c synchronous_commit=off -c full_page_writes=off "
            "-c shared_buffers=128MB"
        )
        self.pid = None

    def start(self):
        out = run_in(
            self.ns,
            [
                str(PG_BIN / "pg_ctl"),
                "-D",
                str(self.dir),
                "-l",
                str(self.log),
                "-w",
                "-t",
                "60",
                "-o",
                self.options,
                "start",
            ],
            user="postgres",
            timeout=90,
        )
        if out.returncode:
            raise RuntimeError(f"pg_ctl start failed: {out.stdout}{out.stderr}\n{self.log.read_text()[-2000:]}")
        self.pid = int((self.dir / "postmaster.pid").read_text().split()[0])

    def psql(self, sql):
        out = run_in(
            self.ns,
            [str(PG_BIN / "psql"), "-h", str(self.sockets), "-U", "postgres", "-At", "-c", sql],
            user="postgres",
            timeout=30,
        )
        if out.returncode:
            raise RuntimeError(f"psql failed: {out.stderr}")
        return out.stdout

    def terminate_backends_of(self, address):
        """``pg_terminate_backend`` every session that machine holds; returns how many."""
        got = self.psql(
            f"SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            f"WHERE client_addr = '{address}'"
        )
        return int(got.strip() or 0)

    def stop(self):
        if self.pid:
            stop_pid(self.pid, signal.SIGINT, timeout=30)  # SIGINT: fast shutdown
            self.pid = None
        if self.root.exists():
            shutil.copy(self.log, self.workdir / "postgres.log")
            shutil.rmtree(self.root, ignore_errors=True)

    def url(self, name="vclmgr"):
        return f"postgres://postgres@{self.address}:{PG_PORT}/{name}"


class Redis:
    def __init__(self, ns, address, workdir):
        self.ns, self.address, self.workdir = ns, address, Path(workdir)
        self.proc = None

    def start(self):
        self.proc = Proc(
            self.ns,
            [
                "redis-server",
                "--bind",
                self.address,
                "--port",
                str(REDIS_PORT),
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
                "--maxmemory",
                "256mb",
                "--maxmemory-policy",
                "noeviction",
                "--dir",
                str(self.workdir),
            ],
            self.workdir / "redis.log",
        )
        return self.proc

    def stop(self):
        if self.proc:
            self.proc.stop()

    def url(self, db=0):
        return f"redis://{self.address}:{REDIS_PORT}/{db}"


# --- the load balancer -------------------------------------------------------------------

HAPROXY_CFG = """\
global
    log stdout format raw local0
    maxconn 4000

defaults
    mode http
    log global
    # epoch.ms server status: the 5xx check reads which machine answered, and when
    log-format "%Ts.%ms %s %ST %HM %HU"
    option redispatch
    retries 3
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    timeout tunnel 1h

frontend www
    bind {address}:{port}
    default_backend web

backend web
    balance roundrobin
    option httpchk
    http-check send meth GET uri /healthz/ready hdr Host {address}
    http-check expect status 200
    # A busy web machine's probe may take a while (a burst of sign-ins is PBKDF2 on every core):
    # only a machine that stops answering is out; with both out, haproxy could only answer 503.
    # A stopped machine refuses connections, and those are redispatched to the other at once.
    timeout check 10s
    timeout queue 60s
    default-server inter 2s fall 4 rise 2
    http-response set-header X-Served-By %s
{servers}
"""


class Haproxy:
    def __init__(self, ns, address, workdir, webs):
        self.ns, self.address = ns, address
        self.cfg = Path(workdir) / "haproxy.cfg"
        servers = "".join(f"    server {name} {addr}:{WEB_PORT} check\n" for name, addr in webs)
        self.cfg.write_text(HAPROXY_CFG.format(address=address, port=LB_PORT, servers=servers))
        self.log_path = Path(workdir) / "haproxy.log"
        self.proc = None

    def start(self):
        # -db: foreground, no daemon, so the pid is the process's own.
        self.proc = Proc(self.ns, [shutil.which("haproxy") or "haproxy", "-db", "-f", str(self.cfg)], self.log_path)
        return self.proc

    def stop(self):
        if self.proc:
            self.proc.stop(signal.SIGUSR1)  # soft stop: finish what is in flight

    def url(self):
        return f"http://{self.address}:{LB_PORT}"


# --- vclmgr's machines -------------------------------------------------------------------


class Machine:
    """One vclmgr machine: ``manage.py serve --role web|worker`` with its own var/ directory."""

    def __init__(self, name, ns, address, role, env, workdir, workers=2):
        self.name, self.ns, self.address, self.role = name, ns, address, role
        self.var = Path(workdir) / name
        self.var.mkdir(exist_ok=True)
        self.env = {**env, "VCLMGR_VAR_DIR": str(self.var)}
        self.workers = workers
        self.proc = None
        self.starts = 0

    def command(self):
        args = [sys.executable, "manage.py", "serve", "--role", self.role]
        if self.role == "web":
            return [*args, "--host", self.address, "--port", str(WEB_PORT)]
        return [*args, "--workers", str(self.workers)]

    def start(self):
        self.starts += 1
        self.proc = Proc(self.ns, self.command(), self.var / "serve.log", env=self.env, lifeline_pipe=True)
        return self.proc

    def ready(self):
        if self.proc is None or not self.proc.alive():
            return False
        if self.role == "web":
            out = run_in(
                self.ns,
                [
                    "curl",
                    "-s",
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code}",
                    "-m",
                    "2",
                    "-H",
                    f"Host: {self.address}",
                    f"http://{self.address}:{WEB_PORT}/healthz/ready",
                ],
            )
            return out.stdout.strip() == "200"
        out = run_in(self.ns, [sys.executable, "manage.py", "worker_check", "--ready"], env=self.env)
        return out.returncode == 0

    def wait_ready(self, timeout=90):
        def check():
            if self.proc is not None and not self.proc.alive():
                raise RuntimeError(f"{self.name} exited while starting:\n{self.proc.tail()}")
            return self.ready()

        wait_until(check, timeout, f"{self.name} to be ready", interval=0.5)

    def stop(self, timeout=20):
        """Like ``systemctl stop``: SIGTERM to serve, which stops its children in order."""
        if self.proc:
            self.proc.stop(timeout=timeout)
