"""A worker for tests/provisioning/test_fencing.py, run as its own process so the test
can freeze it (SIGSTOP) mid-step: claim the next job and run it, appending every call that
reaches the simulated hypervisor to a file (a spy on the real driver) as it happens.

    python -m tests.provisioning.stale_runner CALLS_FILE
"""

import json
import sys
import time

import django


def main(calls_path):
    django.setup()
    from drivers.sim.driver import SimDriver
    from jobs import dispatcher, runner

    real = SimDriver._step

    def spy(self, step):
        with open(calls_path, "a") as calls:
            calls.write(json.dumps([time.monotonic(), step]) + "\n")
        return real(self, step)

    SimDriver._step = spy
    claim = dispatcher.claim_next(runner="first:stale")
    outcome = runner.execute(claim.id, claim.token, time.monotonic() + 120, claim.job, claim.lease_seconds)
    print(json.dumps({"job": claim.id, "generation": claim.job.attempt, "outcome": outcome}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
