"""``/2/filters`` and ``/2/filters/UUID``: Ganeti's job filter rules. Stored at once, as Ganeti
does (the answer is the rule's uuid, not a job); read by staff, written by operators."""

import uuid

from rapi import resources as R
from rapi import services
from rapi.models import FilterRule
from rapi.protocol import RapiError, bad_request
from rapi.views import _check, _fields, _staff

RULE_FIELDS = ("priority", "predicates", "action", "reason")


def _find(filter_uuid):
    try:
        key = uuid.UUID(filter_uuid)
    except ValueError:
        raise RapiError(404, f"Filter '{filter_uuid}' not known") from None
    rule = FilterRule.objects.filter(uuid=key).first()
    if rule is None:
        raise RapiError(404, f"Filter '{filter_uuid}' not known")
    return rule


def _put(request, rule_uuid):
    body = _fields(_check(request.body, dict, "Body contents"), RULE_FIELDS)
    trail = _check(body.get("reason", []), list, "'reason' parameter")
    if not all(isinstance(entry, list) and len(entry) == 3 for entry in trail):
        raise bad_request("'reason' parameter: a list of [source, reason, timestamp]")
    rule = services.put_filter(
        rule_uuid,
        priority=body.get("priority", 0),
        predicates=body.get("predicates", []),
        action=body.get("action", "CONTINUE"),
        reason_trail=trail,
        actor=request.user,
    )
    return str(rule.uuid)


def filters(request):
    _staff(request)
    rules = FilterRule.objects.all()
    if request.flag("bulk"):
        return [R.filter_row(rule) for rule in rules]
    return [{"uuid": str(rule.uuid), "uri": f"/2/filters/{rule.uuid}"} for rule in rules]


def add_filter(request):
    return _put(request, uuid.uuid4())


def get_filter(request, filter_uuid):
    _staff(request)
    return R.filter_row(_find(filter_uuid))


def replace_filter(request, filter_uuid):
    """Replace the rule, or store it under this uuid if there is none (as Ganeti does)."""
    try:
        key = uuid.UUID(filter_uuid)
    except ValueError:
        raise bad_request(f"Invalid filter uuid {filter_uuid[:40]!r}") from None
    return _put(request, key)


def delete_filter(request, filter_uuid):
    services.delete_filter(_find(filter_uuid), actor=request.user)
    return None
