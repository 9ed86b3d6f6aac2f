"""The change log's batch writer writes the rows ``record`` writes, and emit_many those of emit."""

import pytest

from core import changelog, events
from core.models import Event, ObjectChange
from inventory.models import NodeGroup

pytestmark = pytest.mark.django_db
COLUMNS = ["user", "actor", "action", "content_type", "object_id", "object_repr", "changes", "reason"]


def test_record_many_writes_the_rows_record_writes(admin_user):
    groups = [NodeGroup.objects.create(name=f"g{i}") for i in range(3)]
    changelog.record(groups[0], "create", admin_user, {"name": [None, "g0"]}, "why")
    single = list(ObjectChange.objects.values(*COLUMNS))
    ObjectChange.objects.all().delete()
    entries = [(group, "create", {"name": [None, group.name]}) for group in groups]
    assert changelog.record_many(entries, actor=admin_user, reason="why") == 3
    rows = list(ObjectChange.objects.order_by("id").values(*COLUMNS, "time"))
    assert [{k: v for k, v in row.items() if k != "time"} for row in rows[:1]] == single
    assert [row["object_repr"] for row in rows] == ["g0", "g1", "g2"]
    assert len({row["time"] for row in rows}) == 1
    assert changelog.record_many([], actor="cli") == 0


def test_emit_many_without_rows_writes_what_emit_writes():
    events.emit("a.kind", {"x": 1}, ["t1", "t2"])
    single = list(Event.objects.order_by("id").values_list("topic", "kind", "data"))
    Event.objects.all().delete()
    assert events.emit_many([("a.kind", {"x": 1}, ["t1", "t2", "t1"])], rows=False) == 2
    assert list(Event.objects.order_by("id").values_list("topic", "kind", "data")) == single
