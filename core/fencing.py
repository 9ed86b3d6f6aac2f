"""Fencing: code that acts under a lease stops as soon as the lease may be someone else's.

A job runner holds a lease on its job (``jobs.runner``). Its writes to the job
are conditional on the lease in the database; this module covers what the database cannot
guard — calls to a hypervisor. The runner registers its lease for the thread that runs the
job (``holding(lease)``), and every driver contract call (``drivers.base``)
calls ``check()`` before it starts and after it returns. ``check()`` costs nothing while the
lease was confirmed recently (by its heartbeat or a step's write, within ``lease.trusted``
seconds); past that it confirms the lease with a conditional write and raises ``LeaseLost``
if the lease is gone. So a worker that was frozen or cut off past its lease makes no further
hypervisor call once it comes back, and does not go on with the step whose call it was in.

Outside a ``holding`` block (web requests, the janitor, a shell) ``check()`` does nothing.
"""

import threading
from contextlib import contextmanager

_local = threading.local()


class LeaseLost(BaseException):
    """The lease this code acted under is no longer ours: stop, write nothing more.

    A ``BaseException`` (as ``SystemExit``): opcodes and drivers clean up after a failure in
    ``except Exception`` (mark the VM error, the staged image failed, translate to a
    ``DriverError``); a lost lease is no failure of theirs, and the run that owns the job now
    would find those writes over its own. Only the runner catches it.
    """


@contextmanager
def holding(lease):
    """Fence driver calls made in this thread by ``lease`` (an object with ``check()``)."""
    previous = getattr(_local, "lease", None)
    _local.lease = lease
    try:
        yield lease
    finally:
        _local.lease = previous


def check():
    """Raise ``LeaseLost`` if this thread acts under a lease that is gone; else nothing."""
    lease = getattr(_local, "lease", None)
    if lease is not None:
        lease.check()
