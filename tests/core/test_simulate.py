"""The simulator against closed forms, an independent recurrence and hand-computed timelines."""

import dataclasses

import numpy as np
import pytest

from tf_commopt.core.costgraph import CostGraph, Node
from tf_commopt.core.devices import Cluster, Device, Link
from tf_commopt.core.plan import PartitionPlan
from tf_commopt.core.scaling import ring_allreduce_s
from tf_commopt.core.schedule import (
    Forward,
    OptimizerStep,
    RecvAct,
    RecvGrad,
    Schedule,
    SendAct,
    SendGrad,
    gpipe,
)
from tf_commopt.core.simulate import (
    Job,
    RankCost,
    hop_bytes,
    run,
    simulate_data_parallel,
    simulate_job,
    simulate_local_sgd,
    simulate_pipeline,
)
from tf_commopt.errors import InputError, PlanError


def chain(fwd, bwd, act=None, params=None):
    """A chain graph of len(fwd) nodes and the plan putting node i on stage i / device i."""
    p = len(fwd)
    act = act if act is not None else [0.0] * p
    params = params if params is not None else [0.0] * p
    g = CostGraph(
        [Node(f"n{i}", fwd[i], bwd[i], params[i], act[i]) for i in range(p)],
        [(f"n{i}", f"n{i + 1}") for i in range(p - 1)],
        name="chain",
    )
    plan = PartitionPlan(
        "test", {f"n{i}": i for i in range(p)}, list(range(p)), [0.0] * p, [0.0] * p, [0.0] * p, 0.0, 0.0
    )
    return g, plan


@pytest.mark.parametrize("p,m", [(1, 1), (2, 3), (4, 4), (4, 16), (8, 5)])
def test_gpipe_balanced_closed_form(p, m):
    tf, tb = 1.5, 2.5  # per micro-batch; the profile holds M times that per mini-batch
    g, plan = chain([tf * m] * p, [tb * m] * p)
    r = simulate_pipeline(g, plan, "gpipe", microbatches=m)
    assert r.iteration_ms == pytest.approx((m + p - 1) * (tf + tb))
    assert r.throughput == pytest.approx(1000.0 / ((m + p - 1) * (tf + tb)))
    assert r.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))
    assert r.bytes_injected == 0.0
    assert all(v == pytest.approx(m * (tf + tb)) for v in r.busy_ms.values())


def _gpipe_recurrence(f, b, delay, m):
    """Independent reference: GPipe completion times on the (stage, micro-batch) grid when every
    message takes a fixed ``delay`` (true when a transfer never queues)."""
    p = len(f)
    fe = np.zeros((p, m))
    for s in range(p):
        for i in range(m):
            ready = fe[s - 1, i] + delay if s > 0 else 0.0
            prev = fe[s, i - 1] if i > 0 else 0.0
            fe[s, i] = max(ready, prev) + f[s]
    be = np.zeros((p, m))
    for s in reversed(range(p)):
        prev = fe[s, m - 1]
        for i in reversed(range(m)):
            ready = be[s + 1, i] + delay if s < p - 1 else 0.0
            be[s, i] = max(ready, prev) + b[s]
            prev = be[s, i]
    return be[:, 0].max()


@pytest.mark.parametrize("seed", range(4))
def test_gpipe_matches_grid_recurrence_with_communication(seed):
    rng = np.random.RandomState(seed)
    p, m = rng.randint(2, 7), rng.randint(1, 9)
    f, b = rng.uniform(1, 3, p), rng.uniform(1, 5, p)  # per micro-batch
    xfer, lat = 0.8, 0.3  # transfer <= every compute: no queueing
    link = Link(bandwidth_gbps=10.0, latency_ms=lat)
    act = [xfer * link.bytes_per_ms * m] * p  # bytes per mini-batch
    g, plan = chain(f * m, b * m, act)
    cl = Cluster([Device(f"d{i}") for i in range(p)], link)
    r = simulate_pipeline(g, plan, "gpipe", microbatches=m, cluster=cl)
    assert r.iteration_ms == pytest.approx(_gpipe_recurrence(f, b, xfer + lat, m))
    assert r.bytes_injected == pytest.approx(2 * (p - 1) * act[0])


@pytest.mark.parametrize("seed", range(3))
def test_1f1b_steady_throughput_is_one_over_slowest_stage(seed):
    rng = np.random.RandomState(10 + seed)
    p = rng.randint(2, 8)
    f, b = rng.uniform(0.5, 3, p), rng.uniform(0.5, 5, p)
    g, plan = chain(f, b)
    r = simulate_pipeline(g, plan, "1f1b", microbatches=10 * p)
    slowest = max(f + b)
    assert r.iteration_ms == pytest.approx(slowest)
    assert r.throughput == pytest.approx(1000.0 / slowest)
    assert r.bubble_fraction == pytest.approx(1 - np.mean(f + b) / slowest)


@pytest.mark.parametrize("p,m", [(2, 3), (4, 8)])
def test_1f1b_flush_balanced_equals_gpipe(p, m):
    # with balanced stages and free communication 1F1B-Flush has GPipe's bubble: (M + P - 1)(t_f + t_b)
    g, plan = chain([1.0 * m] * p, [2.0 * m] * p)
    r = simulate_pipeline(g, plan, "1f1b_flush", microbatches=m)
    assert r.iteration_ms == pytest.approx((m + p - 1) * 3.0)


def test_hand_computed_gpipe_timeline_with_communication():
    # per micro-batch: t_f = 1, t_b = 2; 625 kB per message = 0.5 ms at 10 Gbit/s, + 0.1 ms latency
    g, plan = chain([2.0, 2.0], [4.0, 4.0], act=[1.25e6, 0.0])
    cl = Cluster.homogeneous(2, bandwidth_gbps=10.0, latency_ms=0.1)
    r = simulate_pipeline(g, plan, "gpipe", microbatches=2, cluster=cl)
    got = sorted((e.kind, e.device, e.mb, round(e.start, 9), round(e.end, 9)) for e in r.events)
    want = sorted(
        [
            ("forward", 0, 0, 0.0, 1.0),
            ("send_act", 0, 0, 1.0, 1.5),
            ("forward", 0, 1, 1.0, 2.0),
            ("send_act", 0, 1, 2.0, 2.5),
            ("forward", 1, 0, 1.6, 2.6),
            ("forward", 1, 1, 2.6, 3.6),
            ("backward", 1, 1, 3.6, 5.6),
            ("send_grad", 1, 1, 5.6, 6.1),
            ("backward", 1, 0, 5.6, 7.6),
            ("send_grad", 1, 0, 7.6, 8.1),
            ("backward", 0, 1, 6.2, 8.2),
            ("backward", 0, 0, 8.2, 10.2),
        ]
    )
    assert got == want
    assert r.iteration_ms == pytest.approx(10.2)
    assert r.bytes_injected == pytest.approx(2.5e6)
    assert r.busy_ms == {0: pytest.approx(6.0), 1: pytest.approx(6.0)}


def test_link_carries_one_transfer_at_a_time():
    # 1.5 ms transfers after 1 ms forwards: the second send queues behind the first
    g, plan = chain([2.0, 2.0], [0.0, 0.0], act=[3.75e6, 0.0])
    r = simulate_pipeline(g, plan, "gpipe", microbatches=2, cluster=Cluster.homogeneous(2, 10.0))
    sends = sorted((e.start, e.end) for e in r.events if e.kind == "send_act")
    assert sends == [(1.0, 2.5), (2.5, 4.0)]
    fwd1 = sorted((e.start, e.end) for e in r.events if e.kind == "forward" and e.device == 1)
    assert fwd1 == [(2.5, 3.5), (4.0, 5.0)]


def test_skip_connection_is_relayed_hop_by_hop():
    g = CostGraph(
        [
            Node("a", 1, 1, activation_bytes=10),
            Node("b", 1, 1, activation_bytes=3),
            Node("c", 1, 1, activation_bytes=7),
            Node("d", 1, 1),
        ],
        [("a", "b"), ("b", "c"), ("c", "d"), ("a", "d"), ("b", "d")],
    )
    son = {"a": 0, "b": 1, "c": 2, "d": 3}
    assert hop_bytes(g, son, 4) == [10.0, 13.0, 20.0]
    plan = PartitionPlan("x", son, [0, 1, 2, 3], [0.0] * 4, [0.0] * 4, [0.0] * 4, 0.0, 0.0)
    r = simulate_pipeline(g, plan, "gpipe", microbatches=2)
    assert r.bytes_injected == pytest.approx(2 * 43.0)


def test_hops_and_bytes_agree_with_the_partition_objective():
    objective = pytest.importorskip("tf_commopt.core.partition.objective")
    from tf_commopt.core.profiles import bundled_profile_path, load_profile

    g = load_profile(bundled_profile_path("pipedream/resnet50"))
    order = g.topological_order()
    k = 4
    rng = np.random.RandomState(0)
    cuts = sorted(rng.choice(np.arange(1, len(order)), k - 1, replace=False))
    stage = np.searchsorted(cuts, np.arange(len(order)), side="right").tolist()
    son = dict(zip(order, stage))
    ev = objective.Problem(g, Cluster.homogeneous(k, 10.0), k).evaluate(stage, list(range(k)))
    hops = hop_bytes(g, son, k)
    assert hops == pytest.approx(list(ev.hop_bytes)[: k - 1]) and sum(hops) == pytest.approx(
        sum(ev.hop_bytes)
    )
    plan = PartitionPlan("x", son, list(range(k)), [0.0] * k, [0.0] * k, [0.0] * k, 0.0, 0.0)
    r = simulate_pipeline(g, plan, "gpipe", microbatches=4, bandwidth_gbps=10.0)
    assert r.bytes_injected == pytest.approx(ev.comm_bytes)
    busy = [r.busy_ms[d] for d in range(k)]
    assert busy == pytest.approx(ev.stage_compute_ms)


def test_capacity_and_micro_profile_override():
    g, plan = chain([4.0, 4.0], [8.0, 8.0])
    cl = Cluster.from_capacities([2.0, 0.5])
    r = simulate_pipeline(g, plan, "gpipe", microbatches=4, cluster=cl)
    assert r.busy_ms == {0: pytest.approx(6.0), 1: pytest.approx(24.0)}
    micro, _ = chain([3.0, 3.0], [3.0, 3.0])  # measured at the micro-batch size: not divided
    r = simulate_pipeline(g, plan, "gpipe", microbatches=2, micro_profile=micro)
    assert r.iteration_ms == pytest.approx((2 + 2 - 1) * 6.0)


def test_data_parallel_ring_allreduce_closed_form():
    caps = [1.0, 1.0, 0.5, 0.25]
    g = CostGraph([Node("a", 3.0, 5.0, param_bytes=4e6), Node("b", 1.0, 3.0, param_bytes=6e6)], [("a", "b")])
    cl = Cluster.from_capacities(caps, bandwidth_gbps=1.0, latency_ms=0.05)
    r = simulate_data_parallel(g, cl)
    n, nbytes = 4, 10e6
    compute = max(12.0 / n / c for c in caps)  # the straggler
    ring = 2 * (n - 1) * 0.05 + 2 * (n - 1) / n * nbytes / (1e9 / 8 / 1e3)
    assert r.iteration_ms == pytest.approx(compute + ring)
    assert ring == pytest.approx(1e3 * ring_allreduce_s(nbytes, n, bandwidth_mbit=1000, latency_s=0.05e-3))
    assert r.bytes_injected == pytest.approx(2 * (n - 1) * nbytes)
    r = simulate_local_sgd(g, cl, interval=4)
    assert r.iteration_ms == pytest.approx(compute + ring / 4)


def test_errors_are_one_line_and_say_where():
    g, plan = chain([1.0, 1.0], [1.0, 1.0])
    with pytest.raises(PlanError, match="node 'n1'.*has no stage"):
        simulate_pipeline(g, dataclasses.replace(plan, stage_of_node={"n0": 0}), "gpipe")
    with pytest.raises(PlanError, match="goes back"):
        simulate_pipeline(g, dataclasses.replace(plan, stage_of_node={"n0": 1, "n1": 0}), "gpipe")
    with pytest.raises(PlanError, match="cluster has 1"):
        simulate_pipeline(g, plan, "gpipe", cluster=Cluster.homogeneous(1))
    with pytest.raises(InputError, match="unknown schedule"):
        simulate_pipeline(g, plan, "zigzag")


def test_engine_rejects_unknown_instruction_and_deadlock():
    cl = Cluster.homogeneous(2)
    ranks = [RankCost(0, 1.0, 1.0), RankCost(1, 1.0, 1.0)]
    s = gpipe(2, 1)
    object.__setattr__(s, "streams", ((Forward(0), object()),) + s.streams[1:])
    with pytest.raises(PlanError, match="unknown instruction"):
        run(Job(s, ranks, cl))
    dead = Schedule("dead", 1, ((RecvGrad(0, 1), SendAct(0, 1)), (RecvAct(0, 0), SendGrad(0, 0))))
    with pytest.raises(PlanError, match="deadlock"):
        run(Job(dead, ranks, cl))


def test_optimizer_cost_is_charged_per_step():
    g, plan = chain([2.0, 2.0], [2.0, 2.0])
    r = simulate_pipeline(g, plan, "gpipe", microbatches=2, optimizer_ms=0.5)
    assert r.iteration_ms == pytest.approx(3 * 2.0 + 0.5)
    assert sum(e.kind == "optimizer" for e in r.events) == 2
    r = simulate_job(
        Job(
            Schedule("one", 1, ((Forward(0), OptimizerStep()),)),
            [RankCost(0, 1, 1, 2)],
            Cluster.homogeneous(1),
        )
    )
    assert r.iteration_ms == 3.0


def test_grouped_hybrid_composition_closed_form():
    # two groups of a 2-stage GPipe pipeline (group 1 on half-speed devices), then each stage's
    # gradients all-reduced between the two groups that hold it (disjoint rings: no contention)
    from tf_commopt.core.schedule import AllReduce, combine

    m, tf, tb = 4, 1.0, 2.0
    part = gpipe(2, m, optimizer_step=False)
    tails = [[AllReduce("s0", (0, 2)), OptimizerStep()], [AllReduce("s1", (1, 3)), OptimizerStep()]] * 2
    sched = combine("hybrid", [part, part], tails)
    caps = [1.0, 1.0, 0.5, 0.5]
    ranks = [RankCost(r, tf / caps[r], tb / caps[r]) for r in range(4)]
    cl = Cluster.from_capacities(caps, bandwidth_gbps=8.0)  # 1e6 bytes per ms
    nbytes = {"s0": 3e6, "s1": 5e6}
    r = simulate_job(Job(sched, ranks, cl, {}, nbytes, split=m))
    slow = 2.0  # group 1 is 2x slower
    end0 = (m + 1) * (tf + tb) * slow  # stage 0 drains last
    end1 = ((m + 1) * (tf + tb) - tb) * slow
    want = max(end0 + 2 * (2 - 1) / 2 * 3e6 / 1e6, end1 + 2 * (2 - 1) / 2 * 5e6 / 1e6)
    assert r.iteration_ms == pytest.approx(want)
    assert r.bytes_injected == pytest.approx(2 * (3e6 + 5e6))


@pytest.mark.parametrize("seed", range(3))
def test_invariants_on_branchy_graphs(seed):
    # on skip-heavy DAGs partitioned by the partitioner: the simulator charges exactly the plan's
    # compute and bytes, and its times respect simple lower and upper bounds
    from tf_commopt.core.partition.api import partition
    from tf_commopt.core.partition.synthetic import branchy_graph

    g = branchy_graph(80, seed=seed)
    k, m, bw = 3 + seed % 2, 6, 10.0
    plan = partition(g, k, method="balanced", bandwidth_gbps=bw)
    r = simulate_pipeline(g, plan, "gpipe", microbatches=m, bandwidth_gbps=bw)
    assert [r.busy_ms[plan.device_of_stage[s]] for s in range(k)] == pytest.approx(plan.stage_compute_ms)
    assert r.bytes_injected == pytest.approx(plan.comm_bytes)
    transfers = plan.comm_bytes / (bw * 1e9 / 8 / 1e3)
    assert max(plan.stage_compute_ms) <= r.iteration_ms <= sum(plan.stage_compute_ms) + transfers + 1e-9
    assert r.iteration_ms >= sum(plan.stage_compute_ms) / m
    a = simulate_pipeline(g, plan, "1f1b", microbatches=12 * k, bandwidth_gbps=bw)
    assert a.throughput <= 1000.0 / max(plan.stage_compute_ms) * (1 + 1e-9)
