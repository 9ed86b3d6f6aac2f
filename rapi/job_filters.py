"""Ganeti's job filter rules (``gnt-filter``), checked and decided without Django.

A rule has a priority (lower first; ties by watermark, then uuid), predicates that must all
hold, and an action. Predicates are ``["jobid", expr]`` (field ``id``; the value ``"watermark"``
is the rule's watermark, the highest job id when it was stored), ``["opcode", expr]`` (the
opcode's fields, ``OP_ID`` and its parameters; any of the job's opcodes) and ``["reason",
expr]`` (``source``, ``reason``, ``timestamp``; any entry of the reason trail). The first rule
whose predicates hold and whose action is not ``CONTINUE`` decides; none: ``ACCEPT``.

All are applied (``rapi.services.screen``): ``REJECT`` cancels the job as it is submitted;
``PAUSE`` keeps it queued and ``["RATE_LIMIT", n]`` lets at most n of the rule's jobs run at
once, both through a rate-limit bucket of the rule's own (``filter:UUID``; 0 for a pause) that
the job scheduler honours; replacing or deleting the rule screens its held jobs again.
"""

from rapi import qfilter

ACTIONS = ("ACCEPT", "CONTINUE", "PAUSE", "REJECT", "RATE_LIMIT")
MAX_RATE = 10000
WATERMARK = "watermark"


class _AnyOpcodeField(dict):
    """An opcode's fields are known per opcode: any name is a field, of a kind known per row."""

    def __contains__(self, name):
        return isinstance(name, str)

    def __getitem__(self, name):
        return "text" if name == "OP_ID" else qfilter.ANY


KINDS = {
    "jobid": {"id": "number"},
    "opcode": _AnyOpcodeField(),
    # vclmgr's reason trail keeps ISO 8601 times (Ganeti's: nanoseconds), so they compare as text.
    "reason": {"source": "text", "reason": "text", "timestamp": "text"},
}


def _with_watermark(node, watermark):
    if isinstance(node, list):
        return [_with_watermark(item, watermark) for item in node]
    return watermark if node == WATERMARK else node


def _compiled(predicate, watermark):
    if not isinstance(predicate, list) or len(predicate) != 2 or predicate[0] not in KINDS:
        raise qfilter.FilterError(
            f"Invalid predicate {predicate!r:.60}: [name, expression] with name one of {', '.join(KINDS)}"
        )
    kind, expression = predicate
    if kind == "jobid":
        expression = _with_watermark(expression, watermark)
    return kind, qfilter.compile_filter(expression, KINDS[kind])


def check_rule(priority, predicates, action):
    """``FilterError`` for a rule vclmgr cannot store or apply; the action's name otherwise."""
    if isinstance(priority, bool) or not isinstance(priority, int) or priority < 0:
        raise qfilter.FilterError("'priority' must be a non-negative integer")
    if not isinstance(predicates, list):
        raise qfilter.FilterError("'predicates' must be a list")
    for predicate in predicates:
        _compiled(predicate, 0)
    name = action[0] if isinstance(action, list) and action else action
    if name not in ACTIONS:
        raise qfilter.FilterError(f"Unknown filter action {action!r:.40}: one of {', '.join(ACTIONS)}")
    if name == "RATE_LIMIT":
        if not isinstance(action, list) or len(action) != 2 or not _count(action[1]):
            raise qfilter.FilterError(f'Filter action RATE_LIMIT is ["RATE_LIMIT", n], n from 1 to {MAX_RATE}')
    elif isinstance(action, list):
        raise qfilter.FilterError(f"Filter action {name} takes no argument")
    return name


def _count(value):
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_RATE


def bucket(rule):
    """``(key, limit)`` of the rate-limit bucket a PAUSE or RATE_LIMIT rule holds its jobs in."""
    limit = 0 if rule["action"] == "PAUSE" else rule["action"][1]
    return f"filter:{rule['uuid']}", limit


def _holds(kind, match, job):
    if kind == "jobid":
        return match({"id": job["id"]})
    if kind == "opcode":
        return any(match(op) for op in job["ops"])
    entries = ({"source": e[0], "reason": e[1], "timestamp": e[2]} for e in job["reason"] if len(e) == 3)
    return any(match(entry) for entry in entries)


def decide(rules, job):
    """The action for ``job`` (``{"id", "ops": [opcode dict…], "reason": [[source, reason, ts]…]}``)
    and the rule that decided it (None for the default ACCEPT). ``rules``: dicts with ``uuid``,
    ``priority``, ``watermark``, ``predicates``, ``action``."""
    for rule in sorted(rules, key=lambda r: (r["priority"], r["watermark"], str(r["uuid"]))):
        compiled = [_compiled(predicate, rule["watermark"]) for predicate in rule["predicates"]]
        if all(_holds(kind, match, job) for kind, match in compiled) and rule["action"] != "CONTINUE":
            return rule["action"], rule
    return "ACCEPT", None
