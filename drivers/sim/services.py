"""Writes to the simulator's settings: hosts and injected faults (admin, API, CLI and tests).

The driver itself changes VM state; these are the knobs an operator turns. Each write is
one transaction with a change-log entry saying who and why.
"""

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from core import changelog
from drivers.sim import steps
from drivers.sim.models import SimFault, SimHost, validate_dhcp_pool

HOST_DEFAULTS = {"cpus": 16, "memory_mib": 65536, "disk_gib": 1000}


def ensure_host(name, *, cpus=None, memory_mib=None, disk_gib=None, dhcp_pool=None, actor=None, reason=""):
    """The simulated host ``name``, created with the given (or default) capacity if missing.

    Capacity given for an existing host updates it, so a demo or test can reshape a host.
    """
    wanted = {"cpus": cpus, "memory_mib": memory_mib, "disk_gib": disk_gib, "dhcp_pool": dhcp_pool}
    wanted = {field: value for field, value in wanted.items() if value is not None}
    _validate_host(name, wanted)
    with transaction.atomic():
        host = SimHost.objects.select_for_update().filter(name=name).first()
        if host is None:
            try:
                with transaction.atomic():
                    host = SimHost.objects.create(name=name, **{**HOST_DEFAULTS, **wanted})
            except IntegrityError:  # another process created it just now
                host = SimHost.objects.select_for_update().get(name=name)
            else:
                changelog.record(host, "create", actor or "sim", {k: [None, v] for k, v in wanted.items()}, reason)
                return host
        before = {field: getattr(host, field) for field in wanted}
        changes = changelog.diff(before, wanted, list(wanted))
        if changes:
            for field, value in wanted.items():
                setattr(host, field, value)
            host.save(update_fields=list(changes))
            changelog.record(host, "update", actor or "sim", changes, reason)
    return host


def _validate_host(name, wanted):
    errors = {}
    if not name or len(name) > 100 or "/" in name or any(ch.isspace() for ch in name):
        errors["name"] = f"{name!r} is not a host name"
    for field in ("cpus", "memory_mib"):
        if field in wanted and (not isinstance(wanted[field], int) or wanted[field] < 1):
            errors[field] = "must be a whole number ≥ 1"
    if "disk_gib" in wanted and (not isinstance(wanted["disk_gib"], int) or wanted["disk_gib"] < 0):
        errors["disk_gib"] = "must be a whole number ≥ 0"
    if "dhcp_pool" in wanted:
        try:
            validate_dhcp_pool(wanted["dhcp_pool"])
        except ValidationError as exc:
            errors["dhcp_pool"] = exc.messages[0]
    if errors:
        raise ValidationError(errors)


def set_fault(host, step, mode, seconds=None, *, actor=None, reason=""):
    """Inject ``mode`` into ``step`` (or ``*``) of ``host`` (a SimHost or its name).

    Modes: ``fail`` (every call fails, permanently), ``fail_once`` (the next call fails with a
    temporary error, later ones succeed), ``hang`` (calls do not answer for ``seconds``,
    default an hour, then report the host unreachable), ``slow`` (calls take ``seconds``
    longer), ``unreachable`` (calls fail with a temporary transport error). Replaces any
    fault already set on that step.
    """
    errors = {}
    if step not in dict(steps.CHOICES):
        errors["step"] = f"unknown step {step!r} (one of {', '.join(dict(steps.CHOICES))})"
    if mode not in SimFault.Mode.values:
        errors["mode"] = f"unknown mode {mode!r} (one of {', '.join(SimFault.Mode.values)})"
    if seconds is not None and (not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds < 0):
        errors["seconds"] = "must be a number of seconds ≥ 0"
    elif mode == SimFault.Mode.SLOW and seconds is None:
        errors["seconds"] = "a slow fault needs seconds"
    if errors:
        raise ValidationError(errors)
    host = host if isinstance(host, SimHost) else ensure_host(host, actor=actor)
    with transaction.atomic():
        fault, created = SimFault.objects.update_or_create(
            host=host, step=step, defaults={"mode": mode, "seconds": seconds}
        )
        changelog.record(
            host,
            "update",
            actor or "sim",
            {f"fault {step}": [None if created else "replaced", f"{mode} {seconds}"]},
            reason,
        )
    return fault


def clear_fault(host, step=None, *, actor=None, reason=""):
    """Remove the fault on ``step`` of ``host`` (every fault of the host if ``step`` is None)."""
    host = host if isinstance(host, SimHost) else SimHost.objects.filter(name=host).first()
    if host is None:
        return 0
    with transaction.atomic():
        faults = SimFault.objects.filter(host=host)
        if step is not None:
            faults = faults.filter(step=step)
        removed = [f"fault {fault.step}" for fault in faults]
        faults.delete()
        if removed:
            changelog.record(host, "update", actor or "sim", {name: ["set", None] for name in removed}, reason)
    return len(removed)


def set_sessions(key, sessions, *, actor=None, reason="guest sessions set"):
    """Who is logged in to the simulated VM ``key`` (a list of ``{"user", "login_time",
    "idle_seconds"}``; [] logs everybody out): what its guest reports to idle reclamation."""
    from drivers.sim.models import SimVM

    rows = []
    for s in sessions:
        if not isinstance(s, dict) or not str(s.get("user", "")).strip():
            raise ValidationError({"sessions": ['each session is {"user": name, ...}']})
        idle = s.get("idle_seconds")
        if idle is not None and (not isinstance(idle, (int, float)) or idle < 0):
            raise ValidationError({"sessions": ["idle_seconds: a number >= 0, or null (not told)"]})
        rows.append({"user": str(s["user"]), "login_time": s.get("login_time"), "idle_seconds": idle})
    with transaction.atomic():
        vm = SimVM.objects.select_for_update().get(key=key)
        old, vm.sessions = vm.sessions, rows
        vm.save(update_fields=["sessions", "updated"])
        changelog.record(vm, "update", actor or "sim", {"sessions": [old, rows]}, reason)
    return vm
