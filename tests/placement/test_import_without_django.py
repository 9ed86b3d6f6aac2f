"""The placement core must stay pure: importing it must not pull in Django."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MODULES = [
    "placement",
    "placement.ganeti",
    "placement.ganeti.iallocator",
    "placement.ganeti.hspace",
    "placement.ganeti.hbal",
    "placement.ganeti.hsqueeze",
    "placement.ganeti.text_backend",
    "placement.ganeti.external",
    "placement.ganeti.bridge",
    "placement.serialize",
    "placement.oneshot",
    "placement.preempt",
    "placement.ganeti.n_plus_one",
    "placement.ganeti.greedy",
    "placement.ganeti.steepest",
]


def test_it_imports_with_django_unconfigured():
    code = (
        "import importlib, json, sys\n"
        f"for m in {MODULES!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'django')))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
