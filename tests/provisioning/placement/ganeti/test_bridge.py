"""Our hosts as a Ganeti cluster: capacity planning and balancing at a moment."""

from provisioning.placement import Allocation, Cluster, Host, NodeGroup, Resources
from provisioning.placement.ganeti.bridge import to_ganeti
from provisioning.placement.ganeti.hspace import HSpaceOptions, Spec, run_hspace
from provisioning.placement.rebalance import RebalanceOptions, consolidate, rebalance

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
    now = run_hspace(
        to_ganeti(lab(), at=1000),
        HSpaceOptions(
            disk_template="plain",
            tiered=Spec.parse("40960,8192,2"),
            standard=Spec.parse("40960,8192,2"),
            capacity=False,
        ),
    )
    later = run_hspace(
        to_ganeti(lab(), at=6000),
        HSpaceOptions(
            disk_template="plain",
            tiered=Spec.parse("40960,8192,2"),
            standard=Spec.parse("40960,8192,2"),
            capacity=False,
        ),
    )
    assert later.standard_count > now.standard_count > 0


def test_rebalance_moves_running_vms_but_respects_future_reservations():
    cluster = lab()
    plan = rebalance(cluster)
    assert plan.final_score < plan.initial_score and plan.moves
    assert all(m.target == "b" for m in plan.moves)  # never the drained host
    # A reservation on b later makes b unable to take the open-ended VMs.
    blocked = Cluster(
        (
            cluster.hosts[0],
            Host(
                "b",
                R(16, 65536, 500),
                reserved=R(1, 4096, 0),
                overcommit={"vcpus": 4},
                allocations=(Allocation("r", R(1, 61440, 1), 2000, 3000),),
            ),
            cluster.hosts[2],
        ),
        cluster.groups,
        cluster.now,
    )
    # Every VM on a overlaps [2000, 3000), when b is promised to someone else: no move.
    assert rebalance(blocked, RebalanceOptions()).moves == []


def test_consolidate_reports_empty_hosts_and_empties_what_fits_elsewhere():
    plan = consolidate(lab(), target_utilisation=0.9)
    assert plan.already_empty == ["b"]
    # b is already off; nothing else can take a's VMs (c is drained).
    assert plan.emptied == [] and plan.moves == []
    two = Cluster(
        (
            lab().hosts[0],
            Host(
                "b",
                R(16, 65536, 500),
                reserved=R(1, 4096, 0),
                overcommit={"vcpus": 4},
                allocations=(Allocation("small", R(1, 1024, 10), 0),),
            ),
        ),
        lab().groups,
        1000,
    )
    plan = consolidate(two, target_utilisation=0.9)
    assert plan.emptied == ["b"] and [m.allocation for m in plan.moves] == ["small"]
