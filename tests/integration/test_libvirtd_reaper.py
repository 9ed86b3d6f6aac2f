"""The shared private libvirtd (tools/localkvm.py) is shut down when its last user dies without
releasing it (an xdist worker killed on Ctrl-C, a SIGKILL): the reaper started with the daemon
notices, destroys what is left and stops the daemon by its PID.

Played with a stand-in daemon (a copy of ``sleep`` under a name of its own) in a state directory
of the test's own, so the machine's shared daemon, which other tests may be using, is not touched."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_reaper_stops_the_daemon_once_its_last_user_died_without_releasing_it(tmp_path):
    stand_in = tmp_path / "bin" / "stand-in-libvirtd"
    stand_in.parent.mkdir()
    shutil.copy("/bin/sleep", stand_in)
    state = tmp_path / "state"
    (state / "users").mkdir(parents=True)
    env = {**os.environ, "VCLMGR_LIBVIRTD_DIR": str(state), "VCLMGR_LIBVIRTD": str(stand_in)}
    started = []
    try:
        daemon = subprocess.Popen([stand_in, "300"])
        started.append(daemon)
        (state / "libvirtd.pid").write_text(f"{daemon.pid}\n")
        user = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        started.append(user)
        (state / "users" / str(user.pid)).touch()
        reaper = subprocess.Popen([sys.executable, str(ROOT / "tools/localkvm.py"), "reap"], env=env, cwd=ROOT)  # noqa: S603
        started.append(reaper)

        time.sleep(2.5)  # the reaper looks every second: a live user keeps the daemon
        assert daemon.poll() is None and reaper.poll() is None

        user.kill()  # dies without releasing
        user.wait()
        assert daemon.wait(timeout=20) is not None
        assert reaper.wait(timeout=10) == 0
        assert list((state / "users").iterdir()) == []
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
