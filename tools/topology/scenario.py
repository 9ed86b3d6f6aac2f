"""A topology run: machines in namespaces, load from locust, faults at random moments, checks.

``run(Config(...))`` builds the network (``net``), starts the database machine (PostgreSQL +
Redis), the web machines behind haproxy, the worker machines, sets the database up from the
client machine (``app setup``), runs locust there while a fault thread strikes, waits for the
work to settle, checks the invariants (``app check``) and the load balancer's log, and returns
a result dict (see ``report`` for the tables). Everything it started is stopped by pid and
every namespace deleted, also when something fails; the logs stay in ``workdir``.

While it runs, a supervisor thread does what systemd's ``Restart=on-failure`` would: a vclmgr
machine whose ``serve`` exited is started again (unless a fault holds it down).
"""

import base64
import json
import os
import random
import secrets
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tools.topology import net, procs

CLK = os.sysconf("SC_CLK_TCK")
STEP_DELAYS = {
    "stage_image": 3.0,
    "create": 1.0,
    "start": 2.0,
    "address": 1.5,
    "stop": 0.5,
    "destroy": 1.0,
    "facts": 0.05,
    "state": 0.05,
    "list_vms": 0.1,
}
FAULTS = (
    "kill a worker machine",
    "cut a worker machine off",
    "restart a web machine",
    "restart Redis",
    "terminate a web and a worker machine's database sessions",
)


@dataclass
class Config:
    workdir: str
    hosts: int = 20
    students: int = 12
    admins: int = 2
    builders: int = 2  # batch runs, one after the other each, while the students work
    cycles: int = 2
    web_machines: int = 2
    worker_machines: int = 3
    workers_per_machine: int = 2
    lease_seconds: int = 10
    limit: int = 12
    spawn_rate: float = 1.0  # sign-ins per second: a burst of PBKDF2 saturates small machines
    time_limit: int = 420  # locust's own bound, seconds
    faults: bool = True
    fault_window: tuple = (15.0, 70.0)  # seconds after the load starts: where faults may strike
    seed: int = field(default_factory=lambda: random.randrange(1 << 30))
    step_delays: dict = field(default_factory=lambda: dict(STEP_DELAYS))
    settle_seconds: int = 180


class Cluster:
    def __init__(self, config):
        self.config = config
        self.work = Path(config.workdir)
        self.net = None
        self.pg = self.redis = self.lb = None
        self.webs, self.workers = [], []
        self.held = set()  # machines a fault keeps down: the supervisor leaves them
        self.restarts = {}
        self.stopping = threading.Event()
        self.cpu = {}  # (pid, start time) -> (machine role, CPU seconds)

    # --- building -------------------------------------------------------------------------

    def build(self):
        c = self.config
        self.net = net.Network()
        db_ns = self.net.add("db", 2)
        lb_ns = self.net.add("lb", 5)
        client_ns = self.net.add("client", 50)
        web_names = [f"web{n + 1}" for n in range(c.web_machines)]
        worker_names = [f"worker{n + 1}" for n in range(c.worker_machines)]
        for n, name in enumerate(web_names):
            self.net.add(name, 11 + n)
        for n, name in enumerate(worker_names):
            self.net.add(name, 21 + n)
        self.pg = procs.Postgres(db_ns, self.net.address("db"), self.work / "db")
        self.pg.start()
        self.pg.psql("CREATE DATABASE vclmgr")
        self.redis = procs.Redis(db_ns, self.net.address("db"), self.work / "db")
        self.redis.start()
        procs.wait_until(lambda: "Ready to accept" in self.redis.proc.tail(), 15, "redis-server")
        self.client_ns = client_ns
        self.env = self._app_env(web_names)
        self.spec = self._phase(
            "setup",
            {
                "hosts": c.hosts,
                "students": c.students,
                "admins": c.admins,
                "builders": c.builders,
                "lease_seconds": c.lease_seconds,
                "limit": c.limit,
            },
        )
        for name in web_names:
            self.webs.append(
                procs.Machine(name, self.net.namespace(name), self.net.address(name), "web", self.env, self.work)
            )
        for name in worker_names:
            self.workers.append(
                procs.Machine(
                    name,
                    self.net.namespace(name),
                    self.net.address(name),
                    "worker",
                    self.env,
                    self.work,
                    workers=c.workers_per_machine,
                )
            )
        for machine in self.webs + self.workers:
            machine.start()
        for machine in self.webs + self.workers:
            machine.wait_ready(timeout=300)
        self.lb = procs.Haproxy(lb_ns, self.net.address("lb"), self.work, [(m.name, m.address) for m in self.webs])
        self.lb.start()
        procs.wait_until(self._lb_ready, 30, "haproxy to see the web machines")
        threading.Thread(target=self._supervise, name="supervisor", daemon=True).start()
        threading.Thread(target=self._sample_cpu, name="cpu", daemon=True).start()

    def _app_env(self, web_names):
        lb = self.net.address("lb")
        hosts = [lb, *(self.net.address(name) for name in web_names)]
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
            "DJANGO_SETTINGS_MODULE": "vclmgr.settings",
            "PYTHONUNBUFFERED": "1",
            "DATABASE_URL": self.pg.url(),
            "REDIS_URL": self.redis.url(0),
            # One installation: every machine shares the keys (sessions, credentials) and the queue.
            "SECRET_KEY": secrets.token_urlsafe(40),
            "CREDENTIAL_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            "VCLMGR_QUEUE_NAME": "topology",
            "DEBUG": "0",
            "ALLOWED_HOSTS": ",".join(hosts),
            "CSRF_TRUSTED_ORIGINS": f"http://{lb}:{procs.LB_PORT}",
            "TRUSTED_PROXIES": "1",
            "SECURE_SSL_REDIRECT": "0",
            "SESSION_COOKIE_SECURE": "0",
            "CSRF_COOKIE_SECURE": "0",
            "SECURE_HSTS_SECONDS": "0",
            "VCLMGR_SIM_OPTIONS": json.dumps({"delay": self.config.step_delays}),
            "LOG_LEVEL": "WARNING",
            "VCLMGR_WORKERS": str(self.config.workers_per_machine),
            "RESERVATION_TICK_SECONDS": "5",
            "API_THROTTLE_USER": "100000/min",
            "LOGIN_LOCKOUT": "0",
        }

    def _phase(self, phase, data):
        source, target = self.work / f"{phase}-in.json", self.work / f"{phase}-out.json"
        source.write_text(json.dumps(data))
        out = procs.run_in(
            self.client_ns,
            [sys.executable, "-m", "tools.topology.app", phase, str(source), str(target)],
            env={**self.env, "VCLMGR_VAR_DIR": str(self.work / "client")},
            timeout=600,
        )
        if out.returncode:
            raise RuntimeError(f"app {phase} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
        return json.loads(target.read_text())

    def _lb_ready(self):
        out = procs.run_in(
            self.client_ns,
            ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "2", f"{self.lb.url()}/healthz/ready"],
        )
        return out.stdout.strip() == "200"

    # --- while it runs --------------------------------------------------------------------

    def machines(self):
        return self.webs + self.workers

    def _supervise(self):
        while not self.stopping.wait(0.5):
            for machine in self.machines():
                if machine.name in self.held or machine.proc is None or machine.proc.alive():
                    continue
                machine.proc.stop()
                self.restarts[machine.name] = self.restarts.get(machine.name, 0) + 1
                machine.start()

    def _sample_cpu(self):
        roles = {m.name: m.role for m in self.machines()} | {"db": "db", "lb": "lb", "client": "client"}
        while not self.stopping.wait(1.0):
            self.sample_cpu_once(roles)

    def sample_cpu_once(self, roles):
        for name, role in roles.items():
            for pid in self.net.pids(name):
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                self.cpu[(pid, fields[19])] = (role, (int(fields[11]) + int(fields[12])) / CLK)

    def cpu_by_role(self):
        totals = {}
        for role, seconds in self.cpu.values():
            totals[role] = totals.get(role, 0.0) + seconds
        return totals

    # --- faults ---------------------------------------------------------------------------

    def kill_machine(self, machine, down_seconds):
        """SIGKILL every process of the machine (a power cut), then boot it again."""
        self.held.add(machine.name)
        killed = self.net.pids(machine.name)
        for pid in killed:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        machine.proc.stop()
        time.sleep(down_seconds)
        machine.start()
        self.held.discard(machine.name)
        return f"{machine.name}: {len(killed)} processes killed, back after {down_seconds:.0f}s"

    def cut_off(self, machine, seconds):
        self.net.cut(machine.name)
        time.sleep(seconds)
        self.net.mend(machine.name)
        return f"{machine.name}: link down {seconds:.0f}s"

    def restart_web(self, machine):
        self.held.add(machine.name)
        machine.stop()
        machine.start()
        try:
            machine.wait_ready(timeout=300)
        finally:
            self.held.discard(machine.name)
        return f"{machine.name}: stopped and started"

    def restart_redis(self):
        self.redis.stop()
        self.redis.start()
        procs.wait_until(lambda: "Ready to accept" in self.redis.proc.tail(), 15, "redis-server")
        return "redis-server stopped and started (empty: no persistence)"

    def terminate_sessions(self, machine):
        return f"{machine.name}: {self.pg.terminate_backends_of(machine.address)} sessions terminated"

    # --- ending ---------------------------------------------------------------------------

    def close(self):
        self.stopping.set()
        for machine in self.machines():
            self.held.add(machine.name)
        for stop in [
            self.lb and self.lb.stop,
            *(m.stop for m in self.machines()),
            self.redis and self.redis.stop,
            self.pg and self.pg.stop,
        ]:
            if stop:
                try:
                    stop()
                except Exception as exc:  # keep stopping the rest
                    print(f"topology: stopping failed: {exc}", file=sys.stderr)
        if self.net:
            for name in list(self.net.machines):
                for pid in self.net.pids(name):  # whatever is left in a machine: by pid
                    procs.stop_pid(pid, signal.SIGKILL, timeout=5)
            self.net.close()


def run(config):
    Path(config.workdir).mkdir(parents=True, exist_ok=True)
    cluster = Cluster(config)
    try:
        began = time.monotonic()
        cluster.build()
        built = time.monotonic() - began
        result = _load(cluster, config)
        result["build_seconds"] = round(built, 1)
        return result
    finally:
        cluster.close()


def _load(cluster, config):
    rng = random.Random(config.seed)
    out = Path(config.workdir) / "locust-record.json"
    hold = Path(config.workdir) / "faults-pending"  # the students go on while it exists
    spec = Path(config.workdir) / "users.json"
    spec.write_text(json.dumps(cluster.spec))
    locust_env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/root"),
        "TOPO_SPEC": str(spec),
        "TOPO_OUT": str(out),
        "TOPO_CYCLES": str(config.cycles),
        "TOPO_HOLD": str(hold),
        "PYTHONUNBUFFERED": "1",
    }
    users = config.students + config.admins + config.builders
    if config.faults:
        hold.touch()
    locust = procs.Proc(
        cluster.client_ns,
        [
            str(Path(sys.executable).parent / "locust"),
            "-f",
            "tools/topology/locustfile.py",
            "--headless",
            "-u",
            str(users),
            "-r",
            str(config.spawn_rate),
            "-t",
            f"{config.time_limit}s",
            "--stop-timeout",
            "10",
            "--host",
            cluster.lb.url(),
            "--csv",
            str(Path(config.workdir) / "locust"),
            "--only-summary",
            "--loglevel",
            "WARNING",
        ],
        Path(config.workdir) / "locust.log",
        env=locust_env,
    )
    started = time.time()
    timeline = []
    faults = threading.Thread(target=_strike, args=(cluster, config, rng, started, timeline, hold), daemon=True)
    if config.faults:
        faults.start()
    try:
        locust.proc.wait(timeout=config.time_limit + 60)
    finally:
        locust.stop(timeout=15)
    load_seconds = time.time() - started
    if config.faults:
        faults.join(timeout=180)
    if not out.exists():
        raise RuntimeError(f"locust wrote no record:\n{locust.tail()}")
    record = json.loads(out.read_text())
    settled = _settle(cluster, config, record)
    checks = cluster._phase(
        "check", {"accepted": record["accepted"], "sockets": record["sockets"], "runs": record["runs"]}
    )
    checks["every fault under load"] = _under_load(timeline, load_seconds, config)
    checks["no 5xx but a restarting web machine's"] = _five_hundreds(cluster.lb.log_path, timeline)
    cluster.sample_cpu_once({m.name: m.role for m in cluster.machines()} | {"db": "db"})
    return {
        "config": {k: v for k, v in asdict(config).items() if k != "step_delays"},
        "checks": checks,
        "timeline": timeline,
        "load_seconds": round(load_seconds, 1),
        "settle_seconds": settled,
        "restarts": cluster.restarts,
        "figures": _figures(record, config, cluster, checks),
        "errors": record["errors"][:30],
        "locust_exit": locust.proc.returncode,
    }


def _strike(cluster, config, rng, started, timeline, hold):
    """Each fault once, in random order, each at a random moment in the fault window; then, a
    lease later (the work a fault disturbed is retried meanwhile), the load may end."""
    try:
        _strike_each(cluster, config, rng, started, timeline)
    finally:
        time.sleep(config.lease_seconds)
        hold.unlink(missing_ok=True)


def _strike_each(cluster, config, rng, started, timeline):
    order = list(FAULTS)
    rng.shuffle(order)
    low, high = config.fault_window
    moments = sorted(rng.uniform(low, high) for _ in order)
    webs, workers = cluster.webs, cluster.workers
    lease = config.lease_seconds
    for name, moment in zip(order, moments, strict=True):
        time.sleep(max(0.0, started + moment - time.time()))
        begin = time.time()
        try:
            if name == "kill a worker machine":
                target = rng.choice(workers)
                what = cluster.kill_machine(target, lease + 2)
            elif name == "cut a worker machine off":
                target = rng.choice(workers)
                what = cluster.cut_off(target, lease * 1.5)
            elif name == "restart a web machine":
                target = rng.choice(webs)
                what = cluster.restart_web(target)
            elif name == "restart Redis":
                target, what = None, cluster.restart_redis()
            else:  # a web machine's pooled sessions and a worker machine's, at once
                target = rng.choice(webs)
                what = cluster.terminate_sessions(target) + "; " + cluster.terminate_sessions(rng.choice(workers))
        except Exception as exc:
            target, what = None, f"failed: {type(exc).__name__}: {exc}"[:300]
        timeline.append(
            {
                "fault": name,
                "at": round(begin - started, 1),
                "seconds": round(time.time() - begin, 1),
                "machine": getattr(target, "name", None),
                "what": what,
                "begin": begin,
                "end": time.time(),
            }
        )


def _settle(cluster, config, record):
    """Wait for the run's jobs to end (the checks read a quiet database)."""
    began = time.monotonic()
    probe = Path(config.workdir) / "settle.json"
    deadline = began + config.settle_seconds
    while time.monotonic() < deadline:
        got = cluster._phase("check", {"accepted": record["accepted"], "sockets": [], "runs": record["runs"]})
        probe.write_text(json.dumps(got, default=str))
        if got["no job stuck"]["ok"] and got["reservations settled"]["ok"] and got["runs ended, output whole"]["ok"]:
            break
        time.sleep(3)
    return round(time.monotonic() - began, 1)


def _under_load(timeline, load_seconds, config):
    """Each fault struck, and was over, while the load still ran (a fault after the load proves nothing)."""
    if not config.faults:
        return {"ok": True, "detail": "no faults in this run"}
    late = [t["fault"] for t in timeline if t["at"] + t["seconds"] > load_seconds]
    return {
        "ok": len(timeline) == len(FAULTS) and not late,
        "detail": f"{len(timeline)} of {len(FAULTS)} faults struck; the load ran {load_seconds:.0f}s; "
        f"{len(late)} ended after it",
        "late": late,
    }


def _five_hundreds(log_path, timeline):
    """5xx answers from the load balancer's log, allowed only from a web machine during its own restart."""
    windows = [
        (t["machine"], t["begin"] - 0.5, t["end"] + 2.0) for t in timeline if t["fault"] == "restart a web machine"
    ]
    allowed, bad, total = 0, [], 0
    for line in Path(log_path).read_text(errors="replace").splitlines():
        parts = line.split()
        if len(parts) < 4 or not parts[2].isdigit():
            continue
        total += 1
        at, server, status = float(parts[0]), parts[1], int(parts[2])
        if status < 500:
            continue
        if any(server.endswith("/" + m) or server == m for m, lo, hi in windows if lo <= at <= hi):
            allowed += 1
        else:
            bad.append(line[:200])
    return {
        "ok": not bad,
        "detail": f"{total} answers, {allowed} 5xx from a restarting web machine, {len(bad)} other 5xx",
        "other": bad[:20],
    }


def _percentile(values, fraction):
    values = sorted(values)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(round(fraction * (len(values) - 1))))]


def _figures(record, config, cluster, checks):
    ready = record["ready"]
    runs = checks.get("runs ended, output whole", {})
    waits = [r["ready"] - r["accepted"] for r in ready]
    span = (max(r["ready"] for r in ready) - min(r["accepted"] for r in ready)) if ready else float("nan")
    api = _locust_latency(Path(config.workdir) / "locust_stats.csv")
    cpu = cluster.cpu_by_role()
    n = max(1, len(ready))
    return {
        "ready": len(ready),
        "accepted": len(record["accepted"]),
        "failed": len(record["failed"]),
        "runs": runs.get("runs", 0),
        "runs_success": runs.get("success", 0),
        "load_errors": len(record["errors"]),
        "throughput_per_s": round(len(ready) / span, 2) if ready else 0.0,
        "reserve_to_ready_p50_s": round(_percentile(waits, 0.5), 2),
        "reserve_to_ready_p99_s": round(_percentile(waits, 0.99), 2),
        **api,
        "cpu_s_per_reservation": {role: round(seconds / n, 3) for role, seconds in sorted(cpu.items())},
    }


def _locust_latency(path):
    import csv

    if not path.exists():
        return {}
    rows = {row["Name"]: row for row in csv.DictReader(path.open())}
    out = {}
    for name in ("reserve", "extend", "end", "dashboard data", "Aggregated"):
        row = rows.get(name)
        if row:
            key = name.replace(" ", "_").lower()
            out[f"api_{key}_p50_ms"] = float(row["50%"] or 0)
            out[f"api_{key}_p99_ms"] = float(row["99%"] or 0)
    return out
