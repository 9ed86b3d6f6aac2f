"""The test helpers' own promise: a process a test starts stops when the test process dies,
however it dies (a run killed by a timeout), not only when its fixture stops it."""

import os
import signal
import subprocess
import sys
import time

from tests.processes import ROOT

STARTER = """
import os, sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vclmgr.settings")
from tests.processes import Child
child = Child([sys.executable, "manage.py", "shell", "-c", "import time; time.sleep(120)"],
              dict(os.environ), Path({log!r}))
print(child.pid, flush=True)
time.sleep(120)
"""


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie waiting for its reaper is gone too
        return stat.read().split(") ")[-1][0] != "Z"


def test_a_child_stops_when_the_test_process_is_killed(tmp_path):
    env = {**os.environ, "DEBUG": "1", "DATABASE_URL": "", "REDIS_URL": ""}
    script = STARTER.format(root=str(ROOT), log=str(tmp_path / "child.log"))
    starter = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    child_pid = None
    try:
        child_pid = int(starter.stdout.readline())
        time.sleep(3)  # let it get as far as Django's set-up (its lifeline watch starts there)
        assert _alive(child_pid)
        starter.send_signal(signal.SIGKILL)  # no fixture teardown, no atexit
        starter.wait()
        deadline = time.monotonic() + 30
        while _alive(child_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(child_pid), (tmp_path / "child.log").read_text()
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait()
        if child_pid is not None and _alive(child_pid):
            os.killpg(child_pid, signal.SIGKILL)
