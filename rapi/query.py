"""``/2/query/RESOURCE`` and ``/2/query/RESOURCE/fields``: Ganeti's generic query (``query2``).

The fields are those the resources already answer (``resources``), with Ganeti's field kinds.
A query answers ``{"fields": [definition…], "data": [[[status, value]…]…]}``; a field it does
not know is answered as Ganeti does, kind ``unknown`` and status ``RS_UNKNOWN`` in every row,
but a filter naming one is refused (400) before anything is read. Who sees what is as on the
resources themselves: nodes, groups and filter rules are staff's, instances and jobs the user's own.
"""

from accounts import access
from jobs import services as jobs
from rapi import qfilter
from rapi import resources as R
from rapi.models import FilterRule
from rapi.protocol import RapiError, bad_request

RS_NORMAL, RS_UNKNOWN = 0, 1


def _kinds(**by_kind):
    return {name: kind for kind, names in by_kind.items() for name in names.split()}


FIELDS = {
    "instance": _kinds(
        text="name admin_state admin_state_source os pnode disk_template status uuid",
        number="network_port oper_ram oper_vcpus serial_no",
        unit="disk_usage",
        bool="oper_state",
        timestamp="ctime mtime",
        other="snodes nic.ips nic.macs nic.modes nic.uuids nic.names nic.links nic.networks nic.networks.names "
        "nic.bridges disk.sizes disk.spindles disk.uuids disk.names beparams hvparams custom_hvparams "
        "custom_beparams custom_nicparams custom_osparams tags",
    ),
    "node": _kinds(
        text="name pip sip role group.uuid uuid",
        bool="offline master_candidate drained master_capable vm_capable",
        unit="dtotal dfree mtotal mnode mfree",
        number="sptotal spfree pinst_cnt sinst_cnt ctotal cnos cnodes csockets serial_no",
        timestamp="ctime mtime",
        other="pinst_list sinst_list ndparams tags",
    ),
    "group": _kinds(
        text="name alloc_policy uuid",
        number="node_cnt serial_no",
        timestamp="ctime mtime",
        other="node_list ipolicy custom_ipolicy diskparams custom_diskparams ndparams custom_ndparams tags",
    ),
    "job": _kinds(
        number="id",
        text="status",
        other="ops summary opstatus received_ts start_ts end_ts oplog opresult",
    ),
    "filter": _kinds(text="uuid action", number="priority watermark", other="predicates reason_trail"),
}
STAFF_ONLY = ("node", "group", "filter")


def _rows(request, what):
    if what in STAFF_ONLY and not access.can(request.user, "see_cluster"):
        raise RapiError(403, f"Only operators and auditors may query the {what}s")
    if what == "instance":
        return R.instance_rows(R.instances_queryset(request.user))
    if what == "node":
        return R.node_rows(R.nodes_queryset())
    if what == "group":
        return R.group_rows()
    if what == "filter":
        return [R.filter_row(rule) for rule in FilterRule.objects.all()]
    visible = jobs.visible_to(request.user).filter(archived=False).order_by("id")
    log_for = lambda job: jobs.log_visible_to(request.user, job)  # noqa: E731 (one line)
    return R.job_rows(visible, viewer=request.user, full=True, log_for=log_for)


def _kinds_of(what):
    if what not in FIELDS:
        raise RapiError(404, f"Resource '{what}' cannot be queried (vclmgr: {', '.join(sorted(FIELDS))})")
    return FIELDS[what]


def _definition(name, kinds):
    if name not in kinds:
        return {"name": name, "title": name, "kind": "unknown", "doc": f"Unknown field '{name}'"}
    title = name.replace("_", " ").replace(".", " ").title()
    return {"name": name, "title": title, "kind": kinds[name], "doc": title}


def _field_names(value, where):
    if not isinstance(value, list) or not value or not all(isinstance(name, str) and name for name in value):
        raise bad_request(f"{where}: a non-empty list of field names")
    return value


def run(request, what, fields, filter_expression):
    kinds = _kinds_of(what)
    try:
        match = qfilter.compile_filter(filter_expression, kinds)
    except qfilter.FilterError as exc:
        raise bad_request(f"Invalid query filter: {exc}") from None
    data = []
    for row in _rows(request, what):
        if match(row):
            data.append([[RS_NORMAL, row[name]] if name in kinds else [RS_UNKNOWN, None] for name in fields])
    return {"fields": [_definition(name, kinds) for name in fields], "data": data}


def query_get(request, what):
    names = request.text("fields")
    if not names:
        raise bad_request("Missing 'fields' query argument")
    return run(request, what, _field_names(names.split(","), "'fields' query argument"), None)


def query_put(request, what):
    body = request.body if request.body is not None else {}
    if not isinstance(body, dict):
        raise bad_request(f"Body contents: Type is '{type(body).__name__}', but 'dict' is expected")
    unknown = sorted(set(body) - {"fields", "qfilter", "filter"})
    if unknown:
        raise bad_request(f"Invalid body parameters: unknown field(s) {', '.join(map(repr, unknown))}")
    if "fields" not in body:
        raise bad_request("Required parameter 'fields' is missing")
    # Ganeti's client sends the filter as both 'qfilter' and its older name 'filter'.
    expression = body.get("qfilter", body.get("filter"))
    return run(request, what, _field_names(body["fields"], "'fields' parameter"), expression)


def query_fields(request, what):
    kinds = _kinds_of(what)
    names = request.text("fields")
    wanted = _field_names(names.split(","), "'fields' query argument") if names else sorted(kinds)
    return {"fields": [_definition(name, kinds) for name in wanted]}
