"""Run every benchmark in bench/ in turn (``make bench``); each prints its own table."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    scripts = sorted(p for p in HERE.glob("*.py") if not p.name.startswith("_") and p.name != "run_all.py")
    failed = []
    for script in scripts:
        print(f"\n=== {script.name} ===", flush=True)
        if subprocess.run([sys.executable, str(script), *sys.argv[1:]], cwd=HERE.parent).returncode:
            failed.append(script.name)
    if failed:
        sys.exit(f"benchmarks failed: {', '.join(failed)}")
