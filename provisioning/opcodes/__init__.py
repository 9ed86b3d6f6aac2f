"""The VM app's opcodes: every hypervisor call of the VM app runs here, as job steps.

One module per concern: ``lifecycle`` (``vm.create``, ``vm.destroy``, power, ``vm.snapshot``,
``vm.revert``), ``capture`` (``vm.capture``), ``migration`` (``vm.migrate``), ``host_ops``
(``node.evacuate``, ``hypervisor.refresh``), ``reuse`` (``vm.park``, ``vm.reuse``: a
``revert_on_end`` VM handed from one user to the next) and ``staging`` (``image.stage``,
``image.prestage`` and the transfer throttle); ``params`` holds their parameters and locks,
``common`` what they share; ``repair`` the verify report's repairs (``repair.*``); ``upload``
(``image.upload``: an uploaded disk checked and made an image); ``resize`` (``vm.resize``: a
VM's vCPUs and memory, its claim first); ``warm`` (``vm.warm``: a warm pool's VM, and the warm
path of a reservation's ``vm.create``). Importing this package registers them all (the jobs
app autodiscovers ``<app>.opcodes``).

Rules every opcode keeps:

- Each step is idempotent (a retried attempt re-runs an interrupted step): driver calls are
  keyed by the VM's key, claims are written in the transaction that records them on the VM.
- No database transaction is open across a driver call: read, commit, call, then write.
- ``vm.create`` leaves nothing half-made: on any failure it destroys what it defined and
  releases the claim, then fails with the reason (the VM row stays, ``failed``, with it).
- A user may only act on their own VMs, also when submitting through the generic jobs API
  (``common.authorised_vm``); staff and system submitters act on any.
- Helpers take the acting user as a keyword, ``actor=``.
"""

from provisioning.opcodes import (  # noqa: F401 (registers them)
    capture,
    host_ops,
    lifecycle,
    migration,
    power,
    repair,
    resize,
    reuse,
    staging,
    upload,
    warm,
)
