"""Simulated grouped hybrid and data parallelism on heterogeneous devices against closed forms."""

import itertools
import random

import numpy as np
import pytest

from tf_commopt.core.costgraph import CostGraph, Node
from tf_commopt.core.devices import Cluster
from tf_commopt.core.plan import HybridPlan, PartitionPlan
from tf_commopt.core.planner import contiguous_groups, plan_hybrid, search_grouped_hybrid, snake_groups
from tf_commopt.core.schedule.hybrid import hybrid_program
from tf_commopt.core.simulate.hybrid import (
    device_speeds,
    grouped_hybrid_job,
    ideal_iteration_ms,
    simulate_dp,
    simulate_grouped_hybrid,
)
from tf_commopt.errors import InputError, PlanError

BW = 10.0
BPM = BW * 1e9 / 8 / 1e3  # bytes per ms


def chain(fwd, bwd, params=None, act=None, kinds=None):
    n = len(fwd)
    params = params or [0.0] * n
    act = act or [0.0] * n
    g = CostGraph(
        [Node(f"n{i}", fwd[i], bwd[i], params[i], act[i]) for i in range(n)],
        [(f"n{i}", f"n{i + 1}") for i in range(n - 1)],
        name="chain",
    )
    for k, scale in (kinds or {}).items():
        g.add_kind(k, {f"n{i}": (fwd[i] * scale, bwd[i] * scale) for i in range(n)})
    return g


def plan_of(stages, devices):
    k = len(devices)
    return PartitionPlan(
        "hand",
        {f"n{i}": s for i, s in enumerate(stages)},
        list(devices),
        [0.0] * k,
        [0.0] * k,
        [0.0] * k,
        0.0,
        0.0,
    )


def ring(nbytes, n):
    return 0.0 if n < 2 else 2.0 * (n - 1) / n * nbytes / BPM


def test_data_parallel_equal_is_straggler_plus_ring():
    g = chain([1.0, 2.0, 3.0], [2.0, 4.0, 6.0], params=[1e6, 2e6, 3e6], kinds={"bf16": 0.5})
    caps, kinds = [1.0, 1.0, 0.5, 0.25, 2.0], [None, "bf16", None, "bf16", None]
    cl = Cluster.from_capacities(caps, BW, kinds=kinds)
    total = {None: 18.0, "bf16": 9.0}
    straggler = max(total[k] / len(caps) / c for c, k in zip(caps, kinds))
    r = simulate_dp(g, cl)
    assert r.iteration_ms == pytest.approx(straggler + ring(6e6, 5))
    assert straggler == pytest.approx(18.0 / 5 / 0.5)


def test_data_parallel_proportional_and_ideal():
    g = chain([1.0, 2.0], [3.0, 5.0], params=[4e6, 0.0], kinds={"fast": 0.25})
    caps, kinds = [1.0, 0.5, 0.25, 1.0], [None, None, "fast", "fast"]
    cl = Cluster.from_capacities(caps, BW, kinds=kinds)
    speeds = [c / (11.0 * (0.25 if k else 1.0)) for c, k in zip(caps, kinds)]
    assert device_speeds(g, cl) == pytest.approx(speeds)
    ideal = 1.0 / sum(speeds)
    assert ideal_iteration_ms(g, cl) == pytest.approx(ideal)
    r = simulate_dp(g, cl, split="proportional")
    assert r.iteration_ms == pytest.approx(ideal + ring(4e6, 4))
    assert set(np.round(list(r.busy_ms.values()), 9)) == {round(ideal, 9)}  # every device busy the same time
    assert r.extra["batch_fractions"] == pytest.approx([s / sum(speeds) for s in speeds])


@pytest.mark.parametrize("m", [1, 3, 8])
def test_one_group_of_one_device_is_single_device(m):
    g = chain(
        [1.0, 2.0, 0.5], [2.0, 3.0, 1.0], params=[1e6, 1e6, 1e6], act=[1e6, 1e6, 0], kinds={"bf16": 0.4}
    )
    for cap, kind in [(1.0, None), (0.25, None), (2.0, "bf16")]:
        cl = Cluster.from_capacities([cap], BW, kinds=[kind])
        r = simulate_grouped_hybrid(g, cl, plan_hybrid(g, cl, [[0]], microbatches=m, method="balanced"))
        assert r.iteration_ms == pytest.approx(g.total_ms(kind) / cap)
        assert r.bytes_injected == 0.0 and r.extra["allreduce_chunks"] == 0


def test_singleton_groups_equal_proportional_data_parallel():
    rng = random.Random(1)
    for _ in range(5):
        n = rng.randint(2, 6)
        g = chain(
            [rng.uniform(0.5, 3) for _ in range(4)],
            [rng.uniform(1, 5) for _ in range(4)],
            params=[rng.uniform(0, 5e6) for _ in range(4)],
        )
        cl = Cluster.from_capacities([rng.choice([1, 0.5, 0.25, 2]) for _ in range(n)], BW)
        hp = plan_hybrid(g, cl, [[i] for i in range(n)], microbatches=1, method="balanced")
        h = simulate_grouped_hybrid(g, cl, hp)
        assert h.iteration_ms == pytest.approx(simulate_dp(g, cl, "proportional").iteration_ms)
        assert h.extra["allreduce_chunks"] == 1


def _gpipe_stage_ends(f, b, m):
    """Independent reference: when each stage's last backward ends (GPipe, free communication)."""
    p = len(f)
    fe = np.zeros((p, m))
    for s in range(p):
        for i in range(m):
            fe[s, i] = max(fe[s - 1, i] if s else 0.0, fe[s, i - 1] if i else 0.0) + f[s]
    be = np.zeros((p, m))
    for s in reversed(range(p)):
        prev = fe[s, m - 1]
        for i in reversed(range(m)):
            be[s, i] = max(be[s + 1, i] if s < p - 1 else 0.0, prev) + b[s]
            prev = be[s, i]
    return be[:, 0]


@pytest.mark.parametrize("m", [1, 2, 5])
def test_two_identical_groups_per_stage_allreduce(m):
    # 2 groups x 2 stages; stage s all-reduces its parameters with the other group's stage s once its
    # last backward is done (the rings of the two stages use different links, so they overlap)
    g = chain([2.0, 1.0], [4.0, 2.0], params=[8e6, 2e6])
    cl = Cluster.from_capacities([1.0, 0.5, 1.0, 0.5], BW)
    plans = [plan_of([0, 1], [0, 1])] * 2
    r = simulate_grouped_hybrid(g, cl, plan_hybrid(g, cl, [[0, 1], [2, 3]], microbatches=m, plans=plans))
    assert r.extra["batch_fractions"] == pytest.approx([0.5, 0.5])
    f = [2.0 * 0.5 / m, 1.0 * 0.5 / m / 0.5]
    b = [4.0 * 0.5 / m, 2.0 * 0.5 / m / 0.5]
    ends = _gpipe_stage_ends(f, b, m)
    expect = max(ends[0] + ring(8e6, 2), ends[1] + ring(2e6, 2))
    assert r.iteration_ms == pytest.approx(expect)
    assert r.bytes_injected == pytest.approx(2 * (8e6 + 2e6))


def test_throughput_split_equalises_groups():
    # group 0: one device of capacity 1; group 1: a 2-stage pipeline of capacities 1 and 1 (M = 4)
    g = chain([1.0, 1.0], [2.0, 2.0])
    cl = Cluster.from_capacities([1.0, 1.0, 1.0], BW)
    plans = [plan_of([0, 0], [0]), plan_of([0, 1], [0, 1])]
    r = simulate_grouped_hybrid(g, cl, plan_hybrid(g, cl, [[0], [1, 2]], microbatches=4, plans=plans))
    t0, t1 = 6.0, (4 + 1) * 3.0 / 4  # alone, whole mini-batch
    fr = [1 / t0 / (1 / t0 + 1 / t1), 1 / t1 / (1 / t0 + 1 / t1)]
    assert r.extra["batch_fractions"] == pytest.approx(fr)
    assert r.iteration_ms == pytest.approx(fr[0] * t0) == pytest.approx(fr[1] * t1)


def test_different_plans_make_chunks():
    # 4 nodes with parameters; group 0 cuts after n0, group 1 after n2: chunks (0,0), (1,0), (1,1)
    g = chain([1, 1, 1, 1], [1, 1, 1, 1], params=[1e6, 2e6, 3e6, 4e6])
    cl = Cluster.from_capacities([1, 1, 1, 1], BW)
    plans = [plan_of([0, 1, 1, 1], [0, 1]), plan_of([0, 0, 0, 1], [1, 0])]
    hp = HybridPlan([[0, 1], [2, 3]], plans, 2, [1.0, 1.0])
    job, prog = grouped_hybrid_job(g, cl, hp, bucket_bytes=None)
    assert [(b.stages, b.nodes, b.nbytes) for b in prog.buckets] == [
        ((1, 1), ("n3",), 4e6),
        ((1, 0), ("n2", "n1"), 5e6),
        ((0, 0), ("n0",), 1e6),
    ]
    assert job.ranks[2].device == 3 and job.ranks[3].device == 2  # the plan's device order is kept
    r = simulate_grouped_hybrid(g, cl, hp, bucket_bytes=None)
    assert r.bytes_injected == pytest.approx(2 * 10e6)
    assert r.extra["allreduce_chunks"] == 3


def test_bounds_and_search_on_random_clusters():
    rng = random.Random(7)
    for _ in range(4):
        n = rng.randint(2, 5)
        g = chain(
            [rng.uniform(0.5, 3) for _ in range(6)],
            [rng.uniform(1, 5) for _ in range(6)],
            params=[rng.uniform(0, 3e6) for _ in range(6)],
            act=[rng.uniform(0, 2e6) for _ in range(6)],
        )
        cl = Cluster.from_capacities([rng.choice([1, 0.5, 0.25]) for _ in range(n)], BW)
        ideal = ideal_iteration_ms(g, cl)
        choice = search_grouped_hybrid(g, cl, microbatches=4, method=("balanced", "pipedream"))
        best, cands = choice.result, choice.candidates
        assert best.iteration_ms == pytest.approx(min(c["iteration_ms"] for c in cands))
        assert simulate_grouped_hybrid(g, cl, choice.plan).iteration_ms == best.iteration_ms
        assert {c["num_groups"] for c in cands} == set(range(1, n + 1))
        assert best.iteration_ms >= ideal * (1 - 1e-9)
        assert simulate_dp(g, cl).iteration_ms >= ideal * (1 - 1e-9)
        # G = N singletons is proportional data parallel (same overlap), so the search never loses to it
        dpo = simulate_dp(g, cl, "proportional", overlap=True)
        assert best.iteration_ms <= dpo.iteration_ms * (1 + 1e-9)
        assert any(
            c["num_groups"] == n and c["iteration_ms"] == pytest.approx(dpo.iteration_ms) for c in cands
        )
        assert dpo.iteration_ms <= simulate_dp(g, cl, "proportional").iteration_ms * (1 + 1e-9)


def test_literal_overlap_streams():
    """2 groups, plans (n0 | n1 n2) and (n0 n1 | n2), a bucket per node: stage ranks 0..3, piece ranks 4, 5."""
    prog = hybrid_program(
        ["n0", "n1", "n2"],
        {"n0": 1, "n1": 1, "n2": 1},
        [{"n0": 0, "n1": 1, "n2": 1}, {"n0": 0, "n1": 0, "n2": 1}],
        2,
        overlap=True,
        bucket_bytes=1,
    )
    assert prog.schedule.compact(compute_only=False) == [
        "F0 SA0>1 F1 SA1>1 RG1<1 B1 RG0<4 B0 AR(grads2:0,5) U",
        "RA0<0 F0 RA1<0 F1 B1 SG1>0 B0 SG0>4 AR(grads0:1,3) RA0<4 U",
        "F0 SA0>3 F1 SA1>3 RG1<3 B1 RG0<3 B0 SG0>5 AR(grads1:2,4) RA0<5 U",
        "RA0<2 F0 RA1<2 F1 B1 SG1>2 B0 SG0>2 AR(grads0:1,3) U",
        "RG0<1 B0 SG0>0 AR(grads1:2,4) SA0>1",
        "RG0<2 B0 AR(grads2:0,5) SA0>2",
    ]
    assert [(x.group, x.stage, x.piece, x.nodes, x.bucket) for x in prog.roles] == [
        (0, 0, 0, ("n0",), "grads2"),
        (0, 1, 0, ("n2",), "grads0"),
        (1, 0, 0, ("n1",), "grads1"),
        (1, 1, 0, ("n2",), "grads0"),
        (0, 1, 1, ("n1",), "grads1"),
        (1, 0, 1, ("n0",), "grads2"),
    ]
    no = hybrid_program(
        ["n0", "n1", "n2"],
        {"n0": 1, "n1": 1, "n2": 1},
        [{"n0": 0, "n1": 1, "n2": 1}, {"n0": 0, "n1": 0, "n2": 1}],
        2,
        overlap=False,
        bucket_bytes=1,
    )
    assert no.schedule.compact() == [
        "F0 F1 B1 B0 AR(grads2:0,2) U",
        "F0 F1 B1 B0 AR(grads0:1,3) AR(grads1:1,2) U",
        "F0 F1 B1 B0 AR(grads1:1,2) AR(grads2:0,2) U",
        "F0 F1 B1 B0 AR(grads0:1,3) U",
    ]


@pytest.mark.parametrize("n", [2, 3])
def test_data_parallel_overlap_against_a_recurrence(n):
    """Proportional DP with one bucket per node: bucket k's ring starts when the backward has passed node
    k and the previous ring has ended (they share the links); closed-form recurrence."""
    fwd, bwd, params = [1.0, 2.0, 0.5, 1.5], [2.0, 3.0, 1.0, 2.5], [3e6, 0.0, 5e6, 2e6]
    g = chain(fwd, bwd, params=params)
    caps = [1.0, 0.5, 0.25][:n]
    cl = Cluster.from_capacities(caps, BW)
    share = sum(caps)  # device d gets caps[d] / share of the batch: every device takes total / share
    F, t, ar = sum(fwd) / share, sum(fwd) / share, 0.0
    for k in reversed(range(4)):
        t += bwd[k] / share
        if params[k] > 0:
            ar = max(ar, t) + ring(params[k], n)
    r = simulate_dp(g, cl, "proportional", overlap=True, bucket_bytes=1.0)
    assert r.iteration_ms == pytest.approx(max(ar, t))
    assert r.extra["allreduce_chunks"] == 3 and F < t
    # one bucket ready only at the end of the backward (n0 has parameters): no overlap, the engine's DP
    one = simulate_dp(g, cl, "proportional", overlap=True, bucket_bytes=None)
    assert one.iteration_ms == pytest.approx(simulate_dp(g, cl, "proportional").iteration_ms)
    assert r.iteration_ms < one.iteration_ms


@pytest.mark.parametrize("overlap", [True, False])
def test_replicated_stage_closed_form(overlap):
    """Stage 0 replicated on devices 0 and 1 (equal speed: half a micro-batch each), stage 1 on device 2;
    M = 1: the replicas' halves of the activations travel on separate links; stage 0's parameters are
    all-reduced between the replicas after their backward, stage 1's are not (one holder)."""

    def simulate_replicated(graph, cluster, plan, stage_devices, microbatches, overlap):
        hp = HybridPlan([[0, 1, 2]], [plan], microbatches, [1.0], stage_devices=[stage_devices])
        return simulate_grouped_hybrid(graph, cluster, hp, overlap=overlap)

    A = 5e6
    g = chain([2.0, 1.0], [4.0, 3.0], params=[6e6, 9e6], act=[A, 0.0])
    cl = Cluster.from_capacities([1.0, 1.0, 1.0], BW)
    plan = plan_of([0, 1], [0, 1])
    r = simulate_replicated(g, cl, plan, [(0, 1), (2,)], microbatches=1, overlap=overlap)
    hop = A / 2 / BPM
    assert r.iteration_ms == pytest.approx(2.0 / 2 + hop + 1.0 + 3.0 + hop + 4.0 / 2 + ring(6e6, 2))
    assert r.extra["allreduce_chunks"] == 1 and r.extra["allreduce_bytes"] == 6e6
    assert r.bytes_injected == pytest.approx(2 * A + 2 * 6e6)
    # uneven capacities: shares follow speed, so both replicas finish their halves together
    cl2 = Cluster.from_capacities([1.0, 0.5, 1.0], BW)
    g0 = chain([2.0, 1.0], [4.0, 3.0])
    r2 = simulate_replicated(g0, cl2, plan, [(0, 1), (2,)], microbatches=1, overlap=overlap)
    assert r2.iteration_ms == pytest.approx(2.0 / 1.5 + 1.0 + 3.0 + 4.0 / 1.5)


def test_search_with_replicated_stages_never_slower():
    g = chain(
        [3.0, 3.0, 1.0, 0.2], [6.0, 6.0, 2.0, 0.4], params=[1e6, 1e6, 2e6, 40e6], act=[4e6, 4e6, 1e6, 0]
    )
    cl = Cluster.from_capacities([1, 1, 0.5, 0.5], BW)
    plain = search_grouped_hybrid(g, cl, microbatches=[2, 4], method="balanced")
    rep = search_grouped_hybrid(
        g, cl, microbatches=[2, 4], method="balanced", replicated=("snake", "wide_first_fast")
    )
    assert rep.result.iteration_ms <= plain.result.iteration_ms
    kinds = {c["grouping"] for c in rep.candidates}
    assert {"replicated:snake", "replicated:wide_first_fast"} <= kinds
    # a big last layer: one device holds it, the rest replicate the early layers (no 40 MB all-reduce)
    assert rep.plan.grouping.startswith("replicated")
    assert rep.result.iteration_ms < 0.8 * simulate_dp(g, cl, "proportional", overlap=True).iteration_ms


def test_groupings():
    speeds = [1, 1, 1, 1, 0.5, 0.5, 0.25, 0.25]
    assert snake_groups(speeds, 2) == [[0, 3, 4, 7], [1, 2, 5, 6]]
    assert contiguous_groups(speeds, 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert contiguous_groups(speeds, 3) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    for G in range(1, 9):
        for fn in (snake_groups, contiguous_groups):
            gs = fn(speeds, G)
            assert sorted(itertools.chain(*gs)) == list(range(8)) and len(gs) == G
            assert max(map(len, gs)) - min(map(len, gs)) <= 1


def test_bad_input():
    g = chain([1, 1], [1, 1])
    cl = Cluster.from_capacities([1, 1, 1])
    two = plan_of([0, 1], [0, 1])
    with pytest.raises(InputError, match="groups must be non-empty, disjoint"):
        plan_hybrid(g, cl, [[0, 1], [1, 2]])
    with pytest.raises(InputError, match="0..2"):
        simulate_grouped_hybrid(g, cl, HybridPlan([[0, 3]], [two], 2, [1.0]))
    with pytest.raises(InputError, match="num_groups must be an integer in 1..3"):
        snake_groups([1, 1, 1], 4)
    with pytest.raises(InputError, match="split must be"):
        simulate_dp(g, cl, split="weird")
    with pytest.raises(InputError, match="need 1 positive group weights"):
        plan_hybrid(g, cl, [[0, 1]], plans=[two], weights=[0.0])
    with pytest.raises(InputError, match="1 plans, 1 group times for 2 groups"):
        HybridPlan([[0], [1]], [two], 2, [1.0])
    with pytest.raises(PlanError, match="a group of 3 devices needs a plan"):
        simulate_grouped_hybrid(g, cl, HybridPlan([[0, 1, 2]], [two], 2, [1.0]))
    with pytest.raises(InputError, match="bucket_bytes must be positive"):
        simulate_grouped_hybrid(g, cl, plan_hybrid(g, cl, [[0], [1, 2]], method="balanced"), bucket_bytes=0)
    with pytest.raises(InputError, match="replica shares must be positive and sum to 1"):
        hybrid_program(["n0", "n1"], {}, [{"n0": 0, "n1": 1}], 2, replica_shares=[[(0.5, 0.6), (1.0,)]])
    with pytest.raises(InputError, match="stage_devices must give each stage"):
        simulate_grouped_hybrid(g, cl, HybridPlan([[0, 1]], [two], 2, [1.0], stage_devices=[[(0, 1), (1,)]]))
    with pytest.raises(InputError, match="unknown replica shape"):
        search_grouped_hybrid(g, cl, replicated=("diagonal",))
    with pytest.raises(InputError, match="unknown grouping"):
        search_grouped_hybrid(g, cl, groupings=("random",))


def _bench(*args):
    from tests.inprocess import run_module

    return run_module("experiments.hybrid_bench", list(args))  # in process, TensorFlow blocked


def test_bench_json_rows_are_the_simulator():
    import json

    from tf_commopt.core.profiles import load_profile

    out = _bench(
        "--json",
        "--profiles=pipedream/alexnet",
        "--clusters=1,0.5,0.25",
        "--bandwidths_gbps=10",
        "--microbatches=4",
        "--methods=balanced",
        "--replicated=wide_first_fast",
    )
    assert out.code == 0, out.err
    rows = [json.loads(line) for line in out.out.splitlines()]
    assert len(rows) == 1
    r = rows[0]
    g = load_profile("pipedream/alexnet")
    cl = Cluster.from_capacities([1, 0.5, 0.25], 10.0)
    best = search_grouped_hybrid(g, cl, microbatches=[4], method=["balanced"], replicated=["wide_first_fast"])
    assert r["hybrid_iteration_ms"] == pytest.approx(best.result.iteration_ms)
    assert r["candidates"] == len(best.candidates)
    assert r["data_parallel_iteration_ms"] == pytest.approx(simulate_dp(g, cl).iteration_ms)
    assert r["data_parallel_proportional_overlap_iteration_ms"] == pytest.approx(
        simulate_dp(g, cl, "proportional", overlap=True).iteration_ms
    )
    assert r["ideal_iteration_ms"] == pytest.approx(ideal_iteration_ms(g, cl))
    assert r["hybrid_iteration_ms"] <= r["data_parallel_proportional_overlap_iteration_ms"] * (1 + 1e-9)


def test_bench_bad_cluster_is_one_line_exit_2():
    out = _bench("--profiles=pipedream/alexnet", "--clusters=1,fast:x")
    assert out.code == 2
    assert out.err.strip().count("\n") == 0 and "--clusters" in out.err and "item 1" in out.err


def test_layers_the_simulator_never_plans_and_the_executor_never_simulates():
    """core/simulate imports no planner or partitioner module; distribute/hybrid imports no simulator
    module (its plan and batch split come from the planner) and never the search itself."""
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_import_cycles import import_graph

    g = import_graph()
    for a, b in g.edges:
        if a.startswith("tf_commopt.core.simulate"):
            assert not b.startswith(("tf_commopt.core.partition", "tf_commopt.core.planner")), (a, b)
        if a.startswith("tf_commopt.distribute.hybrid"):
            assert not b.startswith(("tf_commopt.core.simulate", "tf_commopt.core.partition")), (a, b)
    assert g.has_edge("tf_commopt.distribute.hybrid.trainer", "tf_commopt.core.planner")
