"""The first checks (array-wide and as one loop) agree with `Node.add_pri` on every node
they judge, and with each other."""

import random
from collections import Counter

import pytest

from placement.ganeti import types as T
from placement.ganeti.generate import unbalanced_cluster
from placement.ganeti.instance import Instance
from placement.ganeti.quick_checks import numpy_failures, primary_failures, scalar_failures
from placement.ganeti.simulate import simulated_cluster


def random_instance(rng, template):
    mem = rng.choice([128, 1024, 4096, 16384, 60000, 200000])
    dsk = rng.choice([0, 1024, 10240, 102400, 10**7])
    return Instance(
        "probe",
        mem,
        dsk,
        rng.choice([1, 2, 8, 32, 200]),
        rng.choice(["running", "running", "ADMIN_down", "ADMIN_offline"]),
        True,
        -1,
        -1,
        template,
        [],
        rng.choice([1, 1, 4, 40]),
        [] if template == "diskless" else [(dsk, None)],
    )


@pytest.mark.parametrize("checks", [numpy_failures, scalar_failures, primary_failures])
def test_every_judged_node_fails_exactly_as_add_pri_says(checks):
    rng = random.Random(11)
    clusters = [
        unbalanced_cluster(12, 90, seed=3),
        unbalanced_cluster(9, 150, seed=8),
        simulated_cluster(["p,10,200g,64g,16", "p,4,50g,16g,4,2,True"]),  # exclusive storage, spindles
    ]
    seen = Counter()
    for _ in range(400):
        cluster = rng.choice(clusters)
        inst = random_instance(rng, rng.choice(["plain", "drbd", "diskless", "file", "ext"]))
        nodes = [n for n in cluster.nodes if not n.offline]
        quick = checks(nodes, inst, [None] * len(nodes))
        if checks is scalar_failures:
            assert quick == numpy_failures(nodes, inst, [None] * len(nodes))
        for node, mode in zip(nodes, quick, strict=True):
            try:
                node.add_pri(inst)
                actual = None
            except T.AllocFailure as failure:
                actual = failure.mode
            except ZeroDivisionError:
                actual = "zero cpus"
            if mode is not None:
                assert actual == mode, (node.name, inst, mode, actual)
            seen[(mode, actual)] += 1
    judged = {mode for mode, _ in seen if mode is not None}
    assert {T.FailMode.MEM, T.FailMode.DISK, T.FailMode.CPU} <= judged
    assert seen[(None, None)] > 50  # and nodes that take the instance are left alone


@pytest.mark.parametrize("checks", [numpy_failures, scalar_failures])
def test_a_policy_verdict_comes_first(checks):
    cluster = unbalanced_cluster(6, 20, seed=1)
    inst = random_instance(random.Random(1), "plain")
    modes = checks(cluster.nodes, inst, [T.FailMode.INTERNAL] * len(cluster.nodes))
    assert modes == [T.FailMode.INTERNAL] * len(cluster.nodes)
