"""Our hosts as a Ganeti cluster: capacity planning at a moment."""

from placement import Allocation, Cluster, Host, NodeGroup, Resources
from placement.ganeti.bridge import to_ganeti
from placement.ganeti.hspace import HSpaceOptions, Spec, run_hspace

R = Resources


def lab(now=1000):
    busy = tuple(Allocation(f"vm{k}", R(2, 8192, 40), 0, 5000 if k % 2 else None) for k in range(6))
    return Cluster(
        (
            Host(
                "a",
                R(16, 65536, 500),
                reserved=R(1, 4096, 0),
                overcommit={"vcpus": 4},
                allocations=busy,
            ),
            Host("b", R(16, 65536, 500), reserved=R(1, 4096, 0), overcommit={"vcpus": 4}),
            Host("c", R(16, 65536, 500), state="drained"),
        ),
        (NodeGroup("default"),),
        now,
    )


def test_to_ganeti_takes_the_cluster_at_a_moment():
    g = to_ganeti(lab(), at=1000)
    a, b, c = g.nodes
    assert len(g.instances) == 6 and a.i_mem == 6 * 8192 and a.x_mem == 0
    assert a.n_mem == 4096 and a.n_cpu == 1 and c.offline
    later = to_ganeti(lab(), at=6000)  # the timed half has ended
    assert len(later.instances) == 3


def test_hspace_at_a_moment_counts_what_still_fits():
    spec = Spec.parse("40960,8192,2")
    options = HSpaceOptions(disk_template="plain", tiered=spec, standard=spec, capacity=False)
    now = run_hspace(to_ganeti(lab(), at=1000), options)
    later = run_hspace(to_ganeti(lab(), at=6000), options)
    assert later.standard_count > now.standard_count > 0
