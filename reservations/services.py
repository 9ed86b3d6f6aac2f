"""Reserve, check, extend, end, cancel; block allocations; quotas; the scheduler's tick.

The one public place for the reservation verbs: the web pages, the API, the CLI, the jobs and
the other apps call ``reservations.services.<verb>``. The verbs live in modules by concern,
each importing only those before it: ``visibility``, ``status`` (a status change, its history
and event), ``logins``, ``reserving``, ``ending``, ``settling``, ``host_loss``, ``blocks``,
``approvals`` (a request that waits for an approver), ``environments`` (several machines as
one), ``power`` (an environment suspended, resumed or reverted as one), ``schedule``,
``templates`` (an image's template, published as its next revision). Rules:

- Validation comes first and names the field and, for a quota, the rule; nothing is written
  when anything is wrong (Django ``ValidationError`` with per-field messages).
- A reservation claims its capacity when it is accepted, for its whole window, in the
  transaction that creates it: a future reservation is as sure as one for now, and a request
  that does not fit is refused with the earliest start that would.
- Hypervisors are never called here: building, reverting and destroying VMs are jobs
  (``vm.*`` from the VM app, ``reservation.*`` in ``reservations.opcodes``).
- Every status change is recorded in the history with its reason, and emitted as an event
  (``reservation.changed``) to the reservation's owner, its own topic and the dashboard.
- A status change is a conditional UPDATE (``status.move``, ``extend``): of two racing verbs one
  wins, the other gets ``Conflict`` and writes nothing. The acting user is the keyword ``actor=``.
"""

from reservations.approvals import approve, ask_reservation, decidable, deny, withdraw
from reservations.blocks import (
    block_usage,
    cancel_block,
    create_block,
    managed_blocks,
    may_manage_blocks,
    take_seat,
    teaching_groups,
)
from reservations.ending import cancel, end, extend, finish, held_claims
from reservations.environments import ask as ask_environment
from reservations.environments import machines_of, reach
from reservations.environments import reserve as reserve_environment
from reservations.environments import visible_template as visible_environment
from reservations.host_loss import (
    follow_claim,
    follow_size,
    future_on_host,
    host_left_service,
    on_dead_host,
    replace_off_host,
    reprovision_off_host,
    vm_gone,
)
from reservations.logins import connection, rdp_file
from reservations.power import offered as power_offered
from reservations.power import resume, revert, suspend
from reservations.reserving import budget_notes, check_fit, holdings, provision, reserve, validate
from reservations.schedule import tick
from reservations.settling import build_job, settle, settle_built, settle_unbuilt
from reservations.templates import discard, end_published, open_template, publish, start_template, test_revision
from reservations.visibility import may_see, operable, visible

__all__ = [
    "approve",
    "ask_reservation",
    "ask_environment",
    "decidable",
    "deny",
    "withdraw",
    "block_usage",
    "budget_notes",
    "build_job",
    "cancel",
    "cancel_block",
    "follow_size",
    "check_fit",
    "connection",
    "create_block",
    "discard",
    "end",
    "end_published",
    "extend",
    "finish",
    "follow_claim",
    "future_on_host",
    "held_claims",
    "holdings",
    "host_left_service",
    "managed_blocks",
    "may_manage_blocks",
    "may_see",
    "on_dead_host",
    "open_template",
    "operable",
    "power_offered",
    "provision",
    "publish",
    "rdp_file",
    "replace_off_host",
    "reprovision_off_host",
    "reserve",
    "reserve_environment",
    "resume",
    "revert",
    "suspend",
    "machines_of",
    "reach",
    "visible_environment",
    "settle",
    "settle_built",
    "settle_unbuilt",
    "start_template",
    "take_seat",
    "teaching_groups",
    "test_revision",
    "tick",
    "validate",
    "visible",
    "vm_gone",
]
