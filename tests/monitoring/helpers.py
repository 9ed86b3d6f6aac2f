import os
import shutil
import subprocess

from prometheus_client.parser import text_string_to_metric_families

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def samples(text):
    """{(name, frozenset(labels)): value} of a Prometheus text page."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(found, name, **labels):
    return found.get((name, frozenset(labels.items())), 0.0)


def promtool_check(text):
    """``promtool check metrics`` on the text: (ok, output). A missing promtool fails, never skips."""
    assert os.path.exists(PROMTOOL), "promtool is missing: apt-get install prometheus (make system-test does)"
    done = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
    return done.returncode == 0, (done.stdout + done.stderr).decode()


def stale_live_gauge(folder, pid, clients):
    """A websocket gauge file as a process that ended with ``clients`` sockets open leaves it,
    named for ``pid`` (a pid given again): written by a real prometheus_client process, renamed."""
    import sys
    from pathlib import Path

    code = (
        "import os; from prometheus_client import Gauge; "
        f"Gauge('vclmgr_websocket_clients', 'x', multiprocess_mode='livesum').inc({clients}); "
        "print(os.getpid())"
    )
    writer = subprocess.run(
        [sys.executable, "-c", code],
        env={"PROMETHEUS_MULTIPROC_DIR": str(folder)},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    written = Path(folder) / f"gauge_livesum_{writer.stdout.strip()}.db"
    return written.rename(Path(folder) / f"gauge_livesum_{pid}.db")


def websocket_clients(text):
    return sum(v for (name, _labels), v in samples(text).items() if name == "vclmgr_websocket_clients")
