"""The opcode registry: an opcode name → the function that runs it, and what it needs.

Register with the decorator (it fills the ``OPCODES`` hook), in a module Django imports at start
(``<app>/opcodes.py`` is discovered automatically by the jobs app's ``ready()``)::

    class CreateParams(serializers.Serializer):
        vm = serializers.IntegerField(min_value=1)

    @opcode("vm.create", params=CreateParams, locks=lambda p: [f"vm:{p['vm']}"], staff_only=False)
    def vm_create(job):                      # job: a runner.JobContext
        host = job.step("place", place, job.params["vm"])
        job.step("define", define, job.params["vm"], host)
        return {"host": host}

The function runs in *steps*: ``job.step(name, fn, *args)`` runs ``fn`` once and records its
(JSON) result; when a lost worker's job is retried, completed steps are replayed from the
record instead of run again, so the code between steps must be deterministic and each step
idempotent (a step interrupted mid-way runs again). Cancellation is checked between steps.
``job.submit_child(...)`` expands the job into child jobs. The return value is the result.

``params`` is a DRF serializer class: parameters are validated per field before anything is
queued (unknown names refused). ``locks`` maps validated params to lock declarations
(``"vm:7"`` exclusive, or ``("hypervisor:3", "shared")``). ``staff_only`` says whether users
may submit the opcode themselves (services acting for a user may submit any).
"""

import json
from dataclasses import dataclass
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from rest_framework import serializers

from accounts import access
from core.hooks import Hook


class NoParams(serializers.Serializer):
    pass


@dataclass(frozen=True)
class Opcode:
    name: str
    func: Any
    params: type = NoParams
    locks: Any = None
    staff_only: bool = True
    description: str = ""
    #: what submitting it through an interface needs (``accounts.access``): None = any signed-in user
    capability: str | None = "operate"
    #: the API token scope a submission needs
    scope: str = "operate"

    def lock_list(self, params):
        return list(self.locks(params)) if self.locks else []


OPCODES: Hook[Opcode] = Hook("jobs.registry.OPCODES", keyed=True, single=True)


def opcode(name, *, params=None, locks=None, staff_only=True, description=None, capability=None):
    """Decorator: register ``func`` as the implementation of opcode ``name``."""

    def register(func):
        known = OPCODES.one(name)
        if known is not None and known.func is not func:
            raise ValueError(f"opcode {name!r} is already registered by {known.func.__module__}")
        doc = (func.__doc__ or "").strip().splitlines()
        op = Opcode(
            name=name,
            func=func,
            params=params or NoParams,
            locks=locks,
            staff_only=staff_only,
            description=description or (doc[0] if doc else ""),
            # staff_only keeps its old spelling: such opcodes are the operators' (or ``capability``'s)
            capability=capability or ("operate" if staff_only else None),
            scope={"admin": "admin", None: "operate" if staff_only else "run"}.get(capability, "operate"),
        )
        OPCODES.register(name, op)
        return func

    return register


def get(name):
    """The Opcode, or LookupError naming the known ones."""
    try:
        found = OPCODES.one(name)
    except TypeError:  # an unhashable name
        found = None
    if found is None:
        known = ", ".join(sorted(op.name for op in OPCODES)) or "none"
        raise LookupError(f"unknown opcode {str(name)[:64]!r} (known: {known})")
    return found


def registered(name):
    return OPCODES.one(name) is not None


def all_opcodes():
    return sorted(OPCODES, key=lambda op: op.name)


def may_submit(user, name):
    """May this user submit the opcode through an interface (web, API)?"""
    op = OPCODES.one(name)
    if not (op and user is not None and user.is_authenticated):
        return False
    return op.capability is None or access.can(user, op.capability)


def operator_opcodes():
    """The opcodes that need ``operate`` to submit: the cluster's jobs an operator sees."""
    return [op.name for op in OPCODES if op.capability == "operate"]


def clean_params(op, params):
    """Validated, JSON-ready params; ``serializers.ValidationError`` with per-field messages."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise serializers.ValidationError({"params": ["must be an object of name: value"]})
    serializer = op.params(data=params)
    unknown = sorted(set(params) - set(serializer.fields))
    errors = {name: [f"unknown parameter for {op.name}"] for name in unknown}
    if not serializer.is_valid():
        errors.update(serializer.errors)
    if errors:
        raise serializers.ValidationError(errors)
    return json.loads(json.dumps(serializer.data, cls=DjangoJSONEncoder))


class StringListField(serializers.ListField):
    """A list of strings that also accepts ``"a,b,c"`` (handy from the CLI's ``--param k=a,b``)."""

    child = serializers.CharField(max_length=100)

    def to_internal_value(self, data):
        if isinstance(data, str):
            data = [item.strip() for item in data.split(",") if item.strip()]
        return super().to_internal_value(data)
