"""Locks a job declares: named objects (``vm:7``, ``hypervisor:12``, ``cluster``), shared or exclusive.

Locks are not taken one by one while a job runs (no deadlocks, no partial holds): the
dispatcher starts a job only when none of its locks conflicts with a running job's, and
the job holds them until it ends. Any lock implies ``cluster`` shared, so a job taking
``cluster`` exclusive runs alone among locking jobs. Jobs that declare no lock never wait.
"""

import re

SHARED, EXCLUSIVE = "shared", "exclusive"
MODES = (SHARED, EXCLUSIVE)
CLUSTER = "cluster"
NAME_RE = re.compile(r"[a-z][a-z0-9_-]*(:[A-Za-z0-9_.@-]+)*")


class BadLock(ValueError):
    pass


def normalize(declared):
    """``["vm:7", ("hypervisor:3", "shared")]`` → sorted ``[[name, mode], …]`` with ``cluster``.

    A bare name is exclusive; a name given twice keeps the stronger mode.
    """
    modes = {}
    for item in declared or ():
        name, mode = (item, EXCLUSIVE) if isinstance(item, str) else tuple(item)
        if not isinstance(name, str) or not NAME_RE.fullmatch(name) or len(name) > 100:
            raise BadLock(f"bad lock name {str(name)[:40]!r}: expected kind or kind:id, like vm:7")
        if mode not in MODES:
            raise BadLock(f"lock {name}: mode must be shared or exclusive")
        if modes.get(name) != EXCLUSIVE:
            modes[name] = mode
    if modes and CLUSTER not in modes:
        modes[CLUSTER] = SHARED
    return [[name, modes[name]] for name in sorted(modes)]


class LockTable:
    """Who holds which lock, to find the first conflict of a job's locks."""

    def __init__(self):
        self.held = {}  # name -> (mode, [job ids])

    def add(self, job_id, locks):
        for name, mode in locks:
            current = self.held.get(name)
            if current is None:
                self.held[name] = (mode, [job_id])
            else:
                stronger = EXCLUSIVE if EXCLUSIVE in (mode, current[0]) else SHARED
                self.held[name] = (stronger, [*current[1], job_id])

    def conflict(self, locks):
        """``(name, holders)`` of the first conflicting lock, or None."""
        for name, mode in locks:
            current = self.held.get(name)
            if current and (mode == EXCLUSIVE or current[0] == EXCLUSIVE):
                return name, current[1]
        return None
