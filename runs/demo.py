"""Demo: what a command "run" in the simulated debian-12 guest gives back (a short test suite
with a JUnit report), so a user can start a sample run from the runs page. Idempotent."""

from drivers.sim.models import SimExecProfile

SAMPLE = {
    "output": "".join(f"test_{n:02d} ... ok\n" for n in range(1, 13)) + "Ran 12 tests: OK\n",
    "exit_status": 0,
    "seconds": 6,
    "files": {"out/junit.xml": '<testsuite name="demo" tests="12" failures="0"/>\n'},
}


def runs(stdout):
    _, made = SimExecProfile.objects.get_or_create(image="debian-12", defaults=SAMPLE)
    stdout.write(f"  runs: {'a' if made else 'the'} simulated result for debian-12 runs (start one at /runs/)")
