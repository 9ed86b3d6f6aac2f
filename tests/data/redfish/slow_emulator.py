"""sushy-emulator whose fake hardware takes at least ``BMC_MIN_DELAY`` seconds to apply a reset.

Its fake driver waits ``int(now) + randint(1, 11)``: as little as a fraction of a second. A
test of what happens when a graceful shutdown does not finish in time needs hardware that
is surely slower than the check, whatever the machine's load.
"""

import os
import random
import sys

from sushy_tools.emulator.main import main
from sushy_tools.emulator.resources.systems import fakedriver

LOW = int(os.environ["BMC_MIN_DELAY"])


class _AtLeast:
    @staticmethod
    def randint(a, b):
        return random.randint(max(a, LOW), max(b, LOW))


fakedriver.random = _AtLeast()

if __name__ == "__main__":
    sys.exit(main())
