"""``/2/query``: Ganeti's generic query over the resources' fields, in process."""

import pytest

from inventory.models import Hypervisor
from provisioning import services as vms
from provisioning.models import VM
from tests.rapi.test_protocol import ADMIN, ALICE, call

pytestmark = pytest.mark.django_db


@pytest.fixture
def placed(two_nodes, admin_user, alice):
    host, image = two_nodes
    vms.request_vm(actor="test", owner=alice, image=image, name="web1", memory_mib=1024)
    vms.request_vm(actor="test", owner=admin_user, image=image, name="db1")
    VM.objects.update(host=host, state=VM.State.RUNNING)
    return host


def test_a_put_query_filters_and_answers_ganetis_statuses(placed):
    body = {"fields": ["name", "oper_ram", "colour"], "qfilter": ["&", ["=~", "name", "^web"], [">", "oper_ram", 512]]}
    status, answer, _ = call("PUT", "/2/query/instance", ADMIN, body)
    assert status == 200
    assert answer["data"] == [[[0, "web1"], [0, 1024], [1, None]]]
    assert [(f["name"], f["kind"]) for f in answer["fields"]] == [("name", "text"), ("oper_ram", "number"),
                                                                  ("colour", "unknown")]  # fmt: skip


def test_a_get_query_takes_the_fields_and_no_filter(placed):
    status, answer, _ = call("GET", "/2/query/node?fields=name,role", ADMIN)
    assert status == 200 and answer["data"] == [[[0, "node1"], [0, "R"]], [[0, "node2"], [0, "R"]]]
    assert call("GET", "/2/query/node", ADMIN)[0] == 400


def test_a_bad_filter_is_ganetis_400_with_its_reason(placed):
    status, error, _ = call("PUT", "/2/query/instance", ADMIN, {"fields": ["name"], "qfilter": ["~", "name", "x"]})
    assert status == 400 and error["code"] == 400 and "Unknown operator '~'" in error["message"]
    status, error, _ = call("PUT", "/2/query/instance", ADMIN, {"fields": ["name"], "qfilter": ["=", "colour", 1]})
    assert status == 400 and "Unknown field 'colour'" in error["message"]
    assert call("PUT", "/2/query/instance", ADMIN, {"fields": ["name"], "sort": 1})[0] == 400
    assert call("PUT", "/2/query/lock", ADMIN, {"fields": ["name"]})[0] == 404


def test_query_is_a_read_each_user_sees_what_the_resources_show(placed):
    status, answer, _ = call("PUT", "/2/query/instance", ALICE, {"fields": ["name"]})
    assert status == 200 and answer["data"] == [[[0, "web1"]]]  # a PUT, but a read: no operate needed
    assert call("PUT", "/2/query/node", ALICE, {"fields": ["name"]})[0] == 403
    assert Hypervisor.objects.count() == 2


def test_the_fields_resource_lists_every_field_or_the_named_ones(placed):
    status, answer, _ = call("GET", "/2/query/group/fields", ADMIN)
    assert status == 200 and "node_list" in [f["name"] for f in answer["fields"]]
    status, answer, _ = call("GET", "/2/query/instance/fields?fields=name,colour", ADMIN)
    assert [(f["name"], f["kind"]) for f in answer["fields"]] == [("name", "text"), ("colour", "unknown")]


def test_filter_rules_can_be_queried_by_staff(placed):
    rule = {"priority": 3, "predicates": [], "action": "REJECT"}
    assert call("POST", "/2/filters", ADMIN, rule)[0] == 200
    status, answer, _ = call("PUT", "/2/query/filter", ADMIN, {"fields": ["action"], "qfilter": [">", "priority", 2]})
    assert status == 200 and answer["data"] == [[[0, "REJECT"]]]
    assert call("PUT", "/2/query/filter", ALICE, {"fields": ["uuid"]})[0] == 403
