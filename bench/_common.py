"""What the benchmarks share: a percentile, a wait, and the parent's way to measure in a child.

A benchmark's parent runs each measurement in a child process (``script --one …``) whose
environment selects the database and the broker; the child prints its result as JSON on its
last line of output. bench/ is the script's own folder, first on sys.path: ``from _common import …``.
"""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def setup_django():
    """Django for a measuring child (or any process a benchmark starts), on the settings its
    environment selects."""
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vclmgr.settings")
    import django

    django.setup()


def percentile(values, fraction):
    values = sorted(values)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(round(fraction * (len(values) - 1))))]


def timed(work, repeat=3):
    """The best of ``repeat`` runs of ``work()`` in seconds, and its last answer."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        out = work()
        best = min(best, time.perf_counter() - t)
    return best, out


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise SystemExit(f"timed out after {timeout}s waiting for {what}")


def child_env(var, label, **extra):
    """A child's environment: production-like (no query logging), its own var/ directory and
    queue, SQLite in ``var`` unless ``extra`` names a database, no Redis unless it names one."""
    env = {
        **os.environ,
        "DEBUG": "0",
        "SECRET_KEY": "bench-" + os.urandom(16).hex(),
        "VCLMGR_VAR_DIR": var,
        "VCLMGR_QUEUE_NAME": f"bench-{os.getpid()}-{label}",
        "LOG_LEVEL": "WARNING",
        **extra,
    }
    # The shell's own database and broker never leak into a measurement.
    env["DATABASE_URL"] = extra.get("DATABASE_URL") or f"sqlite:///{var}/bench.sqlite3"
    if not extra.get("REDIS_URL"):
        env.pop("REDIS_URL", None)
    return env


def run_child(command, env, label, timeout=None, echo_stderr=False):
    """Run a measuring child; its result (the JSON of its last line), or exit with its output.
    ``echo_stderr``: show the tail of the child's own report on success too."""
    out = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        print(out.stdout[-2000:], out.stderr[-4000:], file=sys.stderr)
        log = Path(env["VCLMGR_VAR_DIR"]) / "qcluster.log"
        if log.exists():
            print(log.read_text(errors="replace")[-3000:], file=sys.stderr)
        raise SystemExit(f"{label}: benchmark failed")
    if echo_stderr:
        print(out.stderr[-2000:], file=sys.stderr, end="")
    return json.loads(out.stdout.strip().splitlines()[-1])


def start_qcluster(workers):
    """A measuring child's qcluster with ``workers`` worker processes, in its own session (stop
    it with ``os.killpg``); its output goes to ``qcluster.log`` in the child's var/ directory."""
    log_path = Path(os.environ["VCLMGR_VAR_DIR"]) / "qcluster.log"
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"],
            cwd=ROOT,
            env={**os.environ, "VCLMGR_WORKERS": str(workers), "LOG_LEVEL": "WARNING"},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def cpu_seconds(pids=(), session=None):
    """CPU seconds (user + system) used so far by the processes ``pids`` and by every process of
    session ``session`` (a qcluster's: its pid), read from /proc (processes gone are not counted)."""
    wanted, tick, total = set(pids), os.sysconf("SC_CLK_TCK"), 0.0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry.name) in wanted or (session is not None and int(fields[3]) == session):
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_daphne(port, log, env=None):
    """daphne serving the site on loopback ``port``, once it accepts connections; its output
    goes to the open file ``log`` (the caller closes it after stopping the process group)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "vclmgr.asgi:application"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise SystemExit(f"daphne did not start:\n{Path(log.name).read_text(errors='replace')[-3000:]}")


def sim_hosts(count, per_host):
    """``count`` sim hypervisors (sim00, sim01, …) with room for ``per_host`` one-vCPU VMs of
    512 MiB and 5 GiB each, and some to spare."""
    from inventory import services as inventory

    return [
        inventory.create_hypervisor(
            actor="bench",
            name=f"sim{n:02d}",
            address=f"10.78.0.{n + 1}",
            driver="sim",
            cpus=per_host,
            memory_mib=per_host * 512 + 1024,
            disk_gib=per_host * 5 + 10,
        )
        for n in range(count)
    ]
