"""The objective: hand-computed values on small DAGs, incremental == full evaluation, convexity checks."""

import random

import numpy as np
import pytest

from tf_commopt.core.costgraph import CostGraph, Node
from tf_commopt.core.devices import Cluster, Device, Link
from tf_commopt.core.partition import evaluate
from tf_commopt.core.partition.convexity import repair
from tf_commopt.core.partition.local_search import State
from tf_commopt.core.partition.objective import Problem
from tf_commopt.core.partition.synthetic import branchy_graph
from tf_commopt.errors import PlanError

MB = 1.25e6  # bytes that take exactly 1 ms at 10 Gbit/s


def skip_graph():
    """a -> b -> c -> d plus the skip a -> d and a second consumer a -> c."""
    nodes = [
        Node("a", 1, 2, param_bytes=10, activation_bytes=1 * MB),
        Node("b", 2, 3, param_bytes=20, activation_bytes=2 * MB),
        Node("c", 3, 4, param_bytes=30, activation_bytes=3 * MB),
        Node("d", 4, 5, param_bytes=40, activation_bytes=4 * MB),
    ]
    return CostGraph(nodes, [("a", "b"), ("b", "c"), ("c", "d"), ("a", "d"), ("a", "c")])


def test_skip_over_two_stages_costs_every_hop():
    # stages: a | b c | d. a's output goes to stage 1 (b, c: counted once) and stage 2 (d): hops 0 and 1.
    plan = evaluate(skip_graph(), {"a": 0, "b": 1, "c": 1, "d": 2}, bandwidth_gbps=10.0)
    assert plan.extra["hop_bytes"] == [1 * MB, (1 + 3) * MB, 0.0]
    assert plan.stage_compute_ms == [3.0, 12.0, 9.0]
    assert plan.stage_comm_ms == [2 * 1.0, 2 * 4.0, 0.0]  # activations out + gradients back
    assert plan.max_stage_ms == plan.objective == 20.0
    assert plan.comm_bytes == 2 * (1 + 4) * MB
    # memory: params + (K - s) * stashed activations
    assert plan.stage_memory_bytes == [10 + 3 * MB, 50 + 2 * 5 * MB, 40 + 1 * 4 * MB]


def test_capacity_latency_and_device_order():
    g = skip_graph()
    cl = Cluster([Device("fast", 2.0), Device("slow", 0.5), Device("mid", 1.0)], Link(10.0, 0.25))
    plan = evaluate(g, {"a": 0, "b": 1, "c": 1, "d": 2}, device_of_stage=[1, 0, 2], cluster=cl)
    assert plan.stage_compute_ms == [3.0 / 0.5, 12.0 / 2.0, 9.0]
    assert plan.stage_comm_ms == [2 * (0.25 + 1.0), 2 * (0.25 + 4.0), 0.0]
    assert plan.objective == 14.5


def test_per_link_bandwidth():
    g = skip_graph()
    cl = Cluster([Device("x"), Device("y"), Device("z")], Link(10.0), links={(1, 2): Link(1.0)})
    plan = evaluate(g, {"a": 0, "b": 1, "c": 1, "d": 2}, cluster=cl)
    assert plan.stage_comm_ms == [2.0, 2 * 40.0, 0.0]


def test_device_kinds_use_their_own_costs():
    g = skip_graph()
    g.add_kind("bf16", {"a": (0.5, 0.5), "b": (1, 1), "c": (1, 1), "d": (1, 1)})
    plan = evaluate(g, {"a": 0, "b": 0, "c": 1, "d": 1}, kinds=["bf16", None], capacities=[1.0, 2.0])
    assert plan.stage_compute_ms == [3.0, (7 + 9) / 2.0]
    # hop 0 carries a (consumed by c, d) and b (consumed by c)
    assert plan.extra["hop_bytes"][0] == 3 * MB


def test_memory_cap_penalises_and_flags_infeasible():
    g = skip_graph()
    ok = evaluate(g, {"a": 0, "b": 1, "c": 1, "d": 2}, memory=20 * MB)
    assert ok.extra["feasible"] and ok.objective == ok.max_stage_ms
    bad = evaluate(g, {"a": 0, "b": 1, "c": 1, "d": 2}, memory=5 * MB)
    assert not bad.extra["feasible"]
    assert bad.objective > 1000 * bad.max_stage_ms


def test_non_convex_and_empty_stages_are_rejected():
    g = skip_graph()
    with pytest.raises(PlanError, match="not convex: edge 'b' -> 'c'"):
        evaluate(g, {"a": 0, "b": 1, "c": 0, "d": 1})
    p = Problem(g, Cluster.homogeneous(3), 3)
    with pytest.raises(PlanError, match="stage 1 is empty"):
        p.check([0, 0, 2, 2], [0, 1, 2])
    with pytest.raises(PlanError, match="node 'd' has no stage"):
        evaluate(g, {"a": 0, "b": 1, "c": 1})


def _reference(g, stage, devs, caps, bw, lat):
    """Plain-Python objective straight from the definition (independent of Problem)."""
    K = len(devs)
    comp = [0.0] * K
    for n, s in stage.items():
        comp[s] += g[n].compute_ms / caps[devs[s]]
    times = []
    for s in range(K):
        nbytes = sum(
            g[u].activation_bytes
            for u in g.nodes
            if stage[u] <= s < max([stage[u]] + [stage[c] for c in g.successors(u)])
        )
        comm = 2 * (lat + nbytes * 8 / (bw * 1e9) * 1e3) if s < K - 1 and nbytes > 0 else 0.0
        times.append(comp[s] + comm)
    return max(times)


def test_incremental_state_matches_full_and_reference_evaluation():
    rng = random.Random(5)
    g = branchy_graph(200, seed=2)
    K = 5
    cl = Cluster.from_capacities([1, 2, 0.5, 1, 1.5], bandwidth_gbps=25.0, latency_ms=0.1)
    p = Problem(g, cl, K, memory=[2e7, None, 3e7, 2e9, 2e7])  # some stages over their cap
    stage = repair([rng.randrange(K) for _ in range(p.n)], p.pred, p.succ, K)
    st = State(p, stage, [4, 0, 2, 1, 3])
    for _ in range(300):
        s = rng.randrange(K)
        t = s + rng.choice([-1, 1])
        if not 0 <= t < K or len(st.members[s]) < 2:
            continue
        v = rng.choice(sorted(st.members[s]))
        M = st.closure(v, t, limit=rng.randint(1, 20))
        if not M:
            continue
        before = st.try_move(M, s, t)
        st.apply_move(M, s, t)
        assert (st.times[s], st.times[t]) == pytest.approx(before, rel=1e-9)
        if rng.random() < 0.1:
            a, b = rng.sample(range(K), 2)
            st.swap_devices(a, b)
    p.check(st.stage, st.devs)
    for v in range(p.n):  # the maintained frontiers equal a recomputation
        s = st.stage[v]
        assert (v in st.up_front[s]) == all(st.stage[w] > s for w in p.succ[v])
        assert (v in st.down_front[s]) == all(st.stage[u] < s for u in p.pred[v])
        assert st.last[v] == max([s] + [st.stage[w] for w in p.succ[v]])
    ev = p.evaluate(st.stage, st.devs)
    with_pen = [t + q for t, q in zip(ev.stage_ms, ev.stage_penalty_ms)]
    assert st.times == pytest.approx(with_pen, rel=1e-9)
    assert any(q > 0 for q in ev.stage_penalty_ms)
    names = {n: st.stage[p.index[n]] for n in g.nodes}
    assert ev.max_stage_ms == pytest.approx(
        _reference(g, names, st.devs, cl.capacities, 25.0, 0.1), rel=1e-12
    )


def test_repair_gives_convex_labelling():
    rng = random.Random(1)
    g = branchy_graph(150, seed=4)
    p = Problem(g, Cluster.homogeneous(6), 6)
    for _ in range(20):
        lab = repair([rng.randrange(-2, 9) for _ in range(p.n)], p.pred, p.succ, 6)
        p.check(lab, list(range(6)))
        assert np.all(np.asarray(lab)[p.eu] <= np.asarray(lab)[p.ev])
