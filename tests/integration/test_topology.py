"""Several machines at once, under load, with faults: the topology run (``tools/topology``).

Network namespaces stand in for machines: a database machine (its own PostgreSQL and Redis),
two web machines behind haproxy, three worker machines and a client machine running locust
(students reserving, waiting for ready on the websocket, extending and ending; builders running
batch jobs; admins on the dashboard). During the load, each at a random moment (the seed is printed): one worker
machine's processes are all SIGKILLed, another is cut off for longer than a job lease, a web
machine restarts, Redis restarts, and one machine's database sessions are terminated. Then
every invariant must hold (the table is printed). ``python bench/topology.py`` runs the same
with bigger numbers and prints the figures.

It runs on the PostgreSQL leg of ``make test`` (marker ``topology``; the SQLite leg deselects
it): it brings its own PostgreSQL, so the leg's database is not used. It needs root (``ip netns``).
"""

import os
import subprocess

import pytest

from tools.topology import report, scenario

pytestmark = [pytest.mark.slow, pytest.mark.topology]


def test_it_keeps_every_invariant_with_machines_killed_cut_off_and_restarted(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("the topology test makes network namespaces: run it as root (CI does)", pytrace=False)
    config = scenario.Config(workdir=str(tmp_path / "run"))
    print(f"topology seed {config.seed} (again: bench/topology.py --smoke --worker-machines 3 --seed {config.seed})")
    result = scenario.run(config)
    print(report.faults(result))
    print(report.invariants(result))
    print(report.figures([result]))

    leftover = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert f"vclt{os.getpid()}-" not in leftover, "namespaces left behind"
    assert len(result["timeline"]) == len(scenario.FAULTS), result["timeline"]
    assert not [t for t in result["timeline"] if t["what"].startswith("failed")], report.faults(result)
    figures = result["figures"]
    # The load was real: every student did their rounds (more while faults were pending), most
    # reservations became ready, and the builders' runs went through beside them.
    assert figures["accepted"] >= config.students * config.cycles, figures
    assert figures["ready"] >= 0.8 * figures["accepted"], figures
    assert figures["runs_success"] >= config.builders, figures
    assert all(check["ok"] for check in result["checks"].values()), (
        f"seed {config.seed}\n{report.invariants(result)}\n{report.failures(result)}\n{report.faults(result)}"
    )
