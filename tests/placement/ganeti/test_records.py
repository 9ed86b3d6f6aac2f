"""The plain records and `FailMode` behave as the dataclasses and the IntEnum they replace."""

import copy
import pickle

import pytest

from placement.ganeti import types as T
from placement.ganeti.hspace import HSpaceOptions, Spec
from placement.ganeti.instance import Instance
from placement.ganeti.moves import Move
from placement.ganeti.records import replace


def test_fail_modes_count_sort_and_print_as_ganeti_orders_them():
    assert [m.label for m in T.FailMode][:4] == ["FailMem", "FailDisk", "FailCPU", "FailN1"]
    assert list(T.FailMode) == sorted(T.FailMode) == list(range(9))
    assert T.FailMode(3) is T.FailMode.N1 is T.FailMode["N1"]
    assert T.FailMode.N1.name == "N1" and T.FailMode.N1.value == 3 and repr(T.FailMode.N1) == "<FailMode.N1: 3>"
    assert {T.FailMode.MEM: 1}[0] == 1 and len(T.FailMode) == 9
    assert pickle.loads(pickle.dumps(T.FailMode.CPU)) is T.FailMode.CPU
    for bad in (-1, 9, "MEM", None):
        with pytest.raises(ValueError):
            T.FailMode(bad)


def test_frozen_records_compare_hash_and_refuse_assignment():
    spec = Spec(1024, 512, 2)
    assert spec == Spec(1024, 512, 2, 1) and hash(spec) == hash(Spec(1024, 512, 2))
    assert spec != Spec(1024, 512, 3) and spec != (1024, 512, 2, 1)
    assert repr(spec) == "Spec(disk=1024, mem=512, cpu=2, spindles=1)"
    with pytest.raises(AttributeError):
        spec.mem = 1
    assert replace(spec, cpu=4) == Spec(1024, 512, 4)
    with pytest.raises(TypeError):
        replace(spec, bogus=1)
    assert pickle.loads(pickle.dumps(spec)) == spec == copy.copy(spec)
    assert HSpaceOptions(capacity=False).capacity is False and HSpaceOptions().exact is True
    assert {Move("f"), Move("f", -1), Move("r", 2)} == {Move("f"), Move("r", 2)}
    assert T.IPolicy().with_vcpu_ratio(2.0).vcpu_ratio == 2.0 and T.IPolicy() == T.DEFAULT_IPOLICY


def test_mutable_records_default_fresh_lists_as_default_factory_did():
    a, b = Instance("a", 128, 1024, 1), Instance("a", 128, 1024, 1)
    assert a == b and a.tags is not b.tags and a.disks == [(1024, None)]
    assert Instance("d", 128, 0, 1, disk_template="diskless").disks == []
    assert not Instance("p", 128, 1024, 1).movable and Instance("x", 1, 1, 1, disk_template="drbd").movable
    with pytest.raises(TypeError):
        hash(a)
    group = T.Group("g", "u")
    assert group.tags == [] and replace(group, alloc_policy="unallocable").alloc_policy == "unallocable"
    assert pickle.loads(pickle.dumps(group)) == group
