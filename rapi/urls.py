"""Ganeti RAPI v2 routes (``rlib2``'s resource names); anything else under ``/2/`` is Ganeti's 404."""

from django.urls import path, re_path

from rapi import filter_views as fv
from rapi import group_views as gv
from rapi import instance_views as iv
from rapi import protocol
from rapi import views as v
from rapi.protocol import resource

NAME = "<str:name>"

urlpatterns = [
    path("version", v.VERSION, name="rapi-version"),
    path("2", v.ROOT, name="rapi-2"),
    path("2/info", v.INFO, name="rapi-info"),
    path("2/features", v.FEATURES_RESOURCE, name="rapi-features"),
    path("2/tags", v.TAGS, name="rapi-tags"),
    path("2/nodes", v.NODES, name="rapi-nodes"),
    path(f"2/nodes/{NAME}", v.NODE, name="rapi-node"),
    path(f"2/nodes/{NAME}/role", v.NODE_ROLE, name="rapi-node-role"),
    path(f"2/nodes/{NAME}/evacuate", v.NODE_EVACUATE, name="rapi-node-evacuate"),
    path(f"2/nodes/{NAME}/tags", v.NODE_TAGS, name="rapi-node-tags"),
    path("2/groups", v.GROUPS, name="rapi-groups"),
    path(f"2/groups/{NAME}", v.GROUP, name="rapi-group"),
    path(f"2/groups/{NAME}/modify", resource(PUT=gv.modify), name="rapi-group-modify"),
    path(f"2/groups/{NAME}/assign-nodes", resource(PUT=gv.assign_nodes), name="rapi-group-assign-nodes"),
    path("2/instances", v.INSTANCES, name="rapi-instances"),
    path("2/instances-multi-alloc", resource(POST=iv.multi_alloc), name="rapi-instances-multi-alloc"),
    path(f"2/instances/{NAME}", v.INSTANCE, name="rapi-instance"),
    path(f"2/instances/{NAME}/migrate", v.INSTANCE_MIGRATE, name="rapi-instance-migrate"),
    path(f"2/instances/{NAME}/startup", resource(PUT=iv.startup), name="rapi-instance-startup"),
    path(f"2/instances/{NAME}/shutdown", resource(PUT=iv.shutdown), name="rapi-instance-shutdown"),
    path(f"2/instances/{NAME}/reboot", resource(POST=iv.reboot), name="rapi-instance-reboot"),
    path(f"2/instances/{NAME}/failover", resource(PUT=iv.failover), name="rapi-instance-failover"),
    path(f"2/instances/{NAME}/rename", resource(PUT=iv.rename), name="rapi-instance-rename"),
    path(f"2/instances/{NAME}/reinstall", resource(POST=iv.reinstall), name="rapi-instance-reinstall"),
    path(f"2/instances/{NAME}/modify", resource(PUT=iv.modify), name="rapi-instance-modify"),
    path(f"2/instances/{NAME}/console", resource(GET=iv.console_info), name="rapi-instance-console"),
    path(f"2/instances/{NAME}/tags", v.INSTANCE_TAGS, name="rapi-instance-tags"),
    path("2/query/<str:what>", v.QUERY, name="rapi-query"),
    path("2/query/<str:what>/fields", v.QUERY_FIELDS, name="rapi-query-fields"),
    path("2/filters", resource(GET=fv.filters, POST=fv.add_filter), name="rapi-filters"),
    path(
        "2/filters/<str:filter_uuid>",
        resource(GET=fv.get_filter, PUT=fv.replace_filter, DELETE=fv.delete_filter),
        name="rapi-filter",
    ),
    path("2/jobs", v.JOBS, name="rapi-jobs"),
    path("2/jobs/<int:job_id>", v.JOB, name="rapi-job"),
    path("2/jobs/<int:job_id>/wait", v.JOB_WAIT, name="rapi-job-wait"),
    re_path(r"^2/(?P<rest>.*)$", protocol.not_found),
]
