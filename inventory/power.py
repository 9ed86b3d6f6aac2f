"""Host power through the BMC: read it, power a host off, power it on, return it to service.

One verb per function, ``actor=`` keyword-only, each write logged and announced like every
inventory service. The BMC is reached through ``inventory.redfish``; no database
transaction is open while it is called.

- ``power_off`` refuses (``Conflict``) a host that anything still holds — its VMs, its live or
  future claims (``services.IN_USE_CHECKERS``) — and a host without a BMC. It reads the BMC
  first, so a BMC that refuses the credential or does not answer changes nothing; then, under
  the host's row lock, re-checks that nothing holds it and takes it offline ("powered off by
  <actor>: <reason>"), so no claim lands while it shuts down; asks for ``GracefulShutdown`` and,
  when the BMC does not report Off within ``VCLMGR_BMC_GRACEFUL_SECONDS``, ``ForceOff``. If the
  BMC fails after that, the host's previous state is put back. Once Off, the host is
  *standby* (``power_standby``): vclmgr powered it off, so demand may power it on again.
- ``power_on`` asks for ``On`` and waits until the BMC reports it; the host stays as it is
  (offline) until ``return_to_service``, which the ``node.power_on`` job calls once the
  hypervisor answers again.
"""

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core import changelog, events
from core.errors import Conflict, Upstream
from inventory.bmc import BMCError
from inventory.models import Hypervisor
from inventory.resources import host_data
from inventory.services import _host_topics, in_use_reasons, set_state

OFF_PREFIX = "powered off by "
OFF, ON, UNKNOWN = Hypervisor.PowerState.OFF, Hypervisor.PowerState.ON, Hypervisor.PowerState.UNKNOWN


class PowerError(Upstream):
    """The BMC could not do it; ``kind`` as ``redfish.BMCError`` (``auth``, ``unreachable``, ...)."""

    def __init__(self, message, kind):
        super().__init__(message)
        self.kind = kind


def _session(hv):
    bmc = _load(hv).bmc()
    if bmc is None:
        raise Conflict(f"{hv.name} has no BMC: set its bmc_address (or its blade center's) first")
    from inventory import redfish  # here: the Redfish client costs every process's start most of a second

    try:
        return redfish.Session(bmc)
    except BMCError as exc:
        raise PowerError(f"{hv.name}: {exc}", exc.kind) from None


def _load(hv):
    return Hypervisor.objects.select_related("bmc_credential", "blade_center__bmc_credential").get(pk=hv.pk)


def _call(hv, fn, *args):
    try:
        return fn(*args)
    except BMCError as exc:
        raise PowerError(f"{hv.name}: {exc}", exc.kind) from None


@transaction.atomic
def _record(hv, power_state, *, actor, standby=None, reason=""):
    """Store what the BMC reported (and the standby mark); logs and announces a change."""
    locked = Hypervisor.objects.select_for_update().get(pk=hv.pk)
    now = timezone.now()
    new = {"power_state": power_state, "power_standby": locked.power_standby if standby is None else standby}
    changes = changelog.diff({"power_state": locked.power_state, "power_standby": locked.power_standby}, new, list(new))
    Hypervisor.objects.filter(pk=hv.pk).update(power_state_at=now, **new)
    hv.power_state, hv.power_standby, hv.power_state_at = new["power_state"], new["power_standby"], now
    if changes:
        changelog.record(hv, "power", actor, changes, reason)
        data = {**host_data(hv), "power_state": hv.power_state, "power_standby": hv.power_standby}
        events.emit("hypervisor.power", data, _host_topics(hv))


def read_power(hv, *, actor):
    """Ask the BMC for the host's power state; stores and returns it (on / off / unknown)."""
    session = _session(hv)
    state = _call(hv, session.state, False)
    _record(hv, state, actor=actor, reason="read from the BMC")
    return state


def power_off(hv, *, actor, reason, by=""):
    """Power an unused host off (graceful, then forced) and leave it offline on standby.
    ``by``: who, for the state reason (default: the actor)."""
    actor = changelog.Actor.of(actor)
    _refuse_if_held(hv)
    session = _session(hv)  # a BMC that refuses or does not answer: nothing has changed yet
    before = _call(hv, session.state, False)
    allowed = _call(hv, session.allowed)
    old_state, old_reason = _take_offline(hv, f"{OFF_PREFIX}{by or actor.label}: {reason}"[:500], actor=actor)
    try:
        how = "already off"
        if before != OFF:
            how = _shut_down(hv, session, allowed)
    except PowerError as exc:
        with transaction.atomic():
            set_state(hv, old_state, old_reason or "power off failed: back as it was", actor=actor)
        # The reset may have been half done: nobody should take the host for on until it is read again.
        _record(hv, UNKNOWN, actor=actor, reason=str(exc)[:500])
        raise
    _record(hv, OFF, actor=actor, standby=True, reason=reason)
    return {"host": hv.name, "power_state": OFF, "how": how, "state": hv.state, "state_reason": hv.state_reason}


def _refuse_if_held(hv):
    reasons = in_use_reasons(hv)
    if reasons:
        raise Conflict(f"cannot power off {hv.name}: {'; '.join(reasons)}")


@transaction.atomic
def _take_offline(hv, reason, *, actor):
    locked = Hypervisor.objects.select_for_update().get(pk=hv.pk)
    _refuse_if_held(locked)  # again under the row lock: a claim may have landed since the first look
    old = (locked.state, locked.state_reason)
    set_state(hv, Hypervisor.State.OFFLINE, reason, actor=actor)
    return old


def _shut_down(hv, session, allowed):
    graceful = "GracefulShutdown" in allowed or not allowed
    if graceful:
        _call(hv, session.reset, "GracefulShutdown")
        if _call(hv, session.wait, OFF, settings.VCLMGR_BMC_GRACEFUL_SECONDS):
            return "graceful shutdown"
    if allowed and "ForceOff" not in allowed:
        raise PowerError(f"{hv.name}: did not shut down, and its BMC does not allow ForceOff", "timeout")
    _call(hv, session.reset, "ForceOff")
    if not _call(hv, session.wait, OFF, settings.VCLMGR_BMC_POWER_SECONDS):
        raise PowerError(
            f"{hv.name}: the BMC did not report Off within {settings.VCLMGR_BMC_POWER_SECONDS} s of ForceOff", "timeout"
        )
    return "forced off after the graceful shutdown timed out" if graceful else "forced off"


def power_on(hv, *, actor, reason):
    """Power the host on and wait for the BMC to report On (the host's state is left alone)."""
    session = _session(hv)
    if _call(hv, session.state, False) == ON:
        _record(hv, ON, actor=actor, reason=reason)
        return {"host": hv.name, "power_state": ON, "how": "already on"}
    allowed = _call(hv, session.allowed)
    kind = "On" if "On" in allowed or not allowed else "ForceOn"
    _call(hv, session.reset, kind)
    if not _call(hv, session.wait, ON, settings.VCLMGR_BMC_POWER_SECONDS):
        _record(hv, UNKNOWN, actor=actor, reason=f"{kind} requested, not On yet")
        raise PowerError(
            f"{hv.name}: the BMC did not report On within {settings.VCLMGR_BMC_POWER_SECONDS} s of {kind}", "timeout"
        )
    _record(hv, ON, actor=actor, reason=reason)
    return {"host": hv.name, "power_state": ON, "how": kind}


@transaction.atomic
def return_to_service(hv, *, actor, reason, by=""):
    """A powered-on host whose hypervisor answers: online again, no longer on standby.

    Only a host vclmgr took offline for power goes online; one an administrator set offline
    or drained (for another reason) keeps that state."""
    actor = changelog.Actor.of(actor)
    locked = Hypervisor.objects.select_for_update().get(pk=hv.pk)
    if locked.state == Hypervisor.State.OFFLINE and (
        locked.power_standby or locked.state_reason.startswith(OFF_PREFIX)
    ):
        set_state(hv, Hypervisor.State.ONLINE, f"powered on by {by or actor.label}: {reason}"[:500], actor=actor)
    _record(hv, ON, actor=actor, standby=False, reason=reason)
    return {"host": hv.name, "state": hv.state, "power_state": ON}


def standby_hosts(host_ids=None):
    """Ids of hosts vclmgr powered off that demand may power on again (among ``host_ids``)."""
    rows = Hypervisor.objects.filter(power_standby=True, state=Hypervisor.State.OFFLINE)
    if host_ids is not None:
        rows = rows.filter(pk__in=host_ids)
    return set(rows.values_list("pk", flat=True))
