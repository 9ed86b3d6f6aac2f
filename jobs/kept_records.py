"""Step records a job run keeps, written by the run's next database write of its own.

A step run with ``JobContext.step_recorded_later`` keeps its record in memory. The record is
written by whichever comes first: the next database step, a check that must confirm the lease,
the job's end, or a block of the run's own writes between steps marked ``carrying()`` (a VM's
state change at the start of the next step). Such a block writes the records in its own
transaction, lease-checked, so a step costs no transaction of its own.

The run registers itself for its thread (``running``); outside a run ``carrying()`` is a plain
block. Kept here, not in the runner, so that the services that write (``provisioning.services``) need
not import the runner (which imports every opcode).
"""

import threading
from contextlib import contextmanager

from jobs import transitions

_local = threading.local()


@contextmanager
def running(ctx):
    """Register ``ctx`` (a ``JobContext``) as the run of this thread."""
    previous = getattr(_local, "ctx", None)
    _local.ctx = ctx
    try:
        yield
    finally:
        _local.ctx = previous


@contextmanager
def carrying():
    """A block of the running job's own writes, in the caller's transaction: the records it
    keeps are written at the block's end, in its transaction, and the block's events and log
    lines are batched with theirs. A lost lease raises ``LeaseLost`` there and rolls the block
    back with the transaction, so the block's writes are fenced like a step's record."""
    ctx = getattr(_local, "ctx", None)
    if ctx is None or not ctx.keeps_records():
        yield
        return
    with transitions.batched():
        yield
        ctx.write_kept_records()
