"""The pipeline model and the search on it (``score="pipeline"``, the partitioner's default).

References: the discrete-event simulator (the model must equal it for GPipe), brute force over every
convex labelling and device order on tiny graphs, brute force over contiguous splits for PipeDream's
tie-breaks, hand-computed memory.
"""

import itertools
import random

import pytest

from tf_commopt.core.costgraph import CostGraph, Node
from tf_commopt.core.devices import Cluster
from tf_commopt.core.partition import baselines, partition
from tf_commopt.core.partition.api import make_cluster
from tf_commopt.core.partition.convexity import random_topological_order
from tf_commopt.core.partition.objective import Problem
from tf_commopt.core.partition.pipemodel import PipelineModel
from tf_commopt.core.partition.synthetic import branchy_graph
from tf_commopt.core.plan import PartitionPlan
from tf_commopt.core.simulate import simulate_pipeline
from tf_commopt.errors import InputError


def random_dag(rng, n, p_edge=0.35):
    nodes = [
        Node(
            f"v{i}",
            rng.uniform(0, 5),
            rng.uniform(0, 5),
            rng.uniform(0, 1e6),
            rng.choice([0.0, 1e5, 1e6, 5e6, 2e7]),
        )
        for i in range(n)
    ]
    edges = [(f"v{i}", f"v{j}") for j in range(n) for i in range(j) if rng.random() < p_edge]
    return CostGraph(nodes, edges)


def as_plan(p, stage, devs):
    K = len(devs)
    return PartitionPlan(
        "x",
        {n: int(stage[p.index[n]]) for n in p.graph.nodes},
        list(devs),
        [0.0] * K,
        [0.0] * K,
        [0.0] * K,
        0.0,
        0.0,
    )


@pytest.mark.parametrize("trial", range(30))
def test_gpipe_model_equals_the_simulator(trial):
    rng = random.Random(trial)
    g = branchy_graph(rng.randint(8, 50), seed=trial, act_mb=rng.choice([0.5, 4.0, 16.0]))
    K = rng.randint(1, 5)
    D = K + rng.randint(0, 2)
    caps = [rng.choice([0.5, 1.0, 2.0]) for _ in range(D)]
    cl = Cluster.from_capacities(
        caps, bandwidth_gbps=rng.choice([1.0, 10.0, 100.0]), latency_ms=rng.choice([0.0, 0.3])
    )
    p = Problem(g, cl, K)
    devs = rng.sample(range(D), K)
    perm = random_topological_order(p.pred, p.succ, rng)
    stage = (baselines.balanced if trial % 2 else baselines.layerwise)(p, devs, perm)
    M = rng.randint(1, 12)
    want = simulate_pipeline(g, as_plan(p, stage, devs), "gpipe", microbatches=M, cluster=cl).iteration_ms
    assert PipelineModel(p, "gpipe", M).time(stage, devs) == pytest.approx(want, rel=1e-9)


def test_1f1b_model_on_a_hand_example():
    # balanced stages 1 + 2 ms, free links: one micro-batch every 3 ms; a 4 ms stage sets the period;
    # a slow link (8 MB at 1 Gbit/s = 64 ms each way) with K=2 sets it through the window of stage 0:
    # (sum of f+b over both stages + 64 + 64) / 2.
    g = CostGraph([Node("a", 1, 2, activation_bytes=0), Node("b", 1, 2)], [("a", "b")])
    p = Problem(g, Cluster.homogeneous(2), 2)
    assert PipelineModel(p, "1f1b").time([0, 1], [0, 1]) == pytest.approx(3.0)
    g2 = CostGraph([Node("a", 1, 2, activation_bytes=8e6), Node("b", 2, 2)], [("a", "b")])
    p2 = Problem(g2, Cluster.homogeneous(2, bandwidth_gbps=1.0), 2)
    assert PipelineModel(p2, "1f1b").time([0, 1], [0, 1]) == pytest.approx((3 + 4 + 64 + 64) / 2)
    sim = simulate_pipeline(
        g2,
        as_plan(p2, [0, 1], [0, 1]),
        "1f1b",
        microbatches=40,
        cluster=Cluster.homogeneous(2, bandwidth_gbps=1.0),
    )
    # the simulator measures a finite window (start-up and drain cut off): 67.4 ms here, not the cycle's 67.5
    assert 1000.0 / sim.throughput == pytest.approx((3 + 4 + 64 + 64) / 2, rel=0.01)


def brute_force(p, model):
    best = float("inf")
    for lab in itertools.product(range(p.K), repeat=p.n):
        if len(set(lab)) < p.K or any(lab[u] > lab[v] for u, v in zip(p.eu, p.ev)):
            continue
        for devs in itertools.permutations(range(p.D), p.K):
            best = min(best, model.time(lab, devs))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_ga_finds_the_brute_force_pipeline_optimum_on_tiny_graphs(seed):
    rng = random.Random(500 + seed)
    n, K = rng.randint(4, 7), rng.choice([2, 3])
    g = random_dag(rng, n)
    caps = [rng.choice([0.5, 1.0, 2.0]) for _ in range(K)]
    bw, M = rng.choice([1.0, 10.0]), rng.choice([1, 4, 8])
    plan = partition(g, K, method="ga", capacities=caps, bandwidth_gbps=bw, seed=seed, microbatches=M)
    p = Problem(g, Cluster.from_capacities(caps, bandwidth_gbps=bw), K)
    model = PipelineModel(p, "gpipe", M)
    stage = [plan.stage_of_node[v] for v in p.order]
    assert plan.extra["model_ms"] == pytest.approx(model.time(stage, plan.device_of_stage), rel=1e-9)
    assert plan.extra["model_ms"] == pytest.approx(brute_force(p, model), rel=1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_search_is_never_worse_than_any_baseline_variant_or_its_seeds(seed):
    rng = random.Random(seed)
    g = branchy_graph(rng.randint(30, 80), seed=seed, act_mb=rng.choice([1.0, 8.0]))
    K = rng.choice([2, 3, 4])
    caps = [rng.choice([0.5, 1.0]) for _ in range(K)] if seed % 2 else None
    bw = rng.choice([1.0, 10.0, 100.0])
    sched = "gpipe" if seed % 3 else "1f1b"
    kw = dict(capacities=caps, bandwidth_gbps=bw, schedule=sched, seed=seed)
    ga, local = partition(g, K, method="ga", **kw), partition(g, K, method="local", **kw)
    assert ga.extra["ga_best_ms"] <= ga.extra["local_best_ms"] * (1 + 1e-12)
    assert ga.extra["local_best_ms"] <= ga.extra["seeds_best_ms"] * (1 + 1e-12)
    assert local.extra["model_ms"] == pytest.approx(ga.extra["local_best_ms"], rel=1e-12)
    p = Problem(g, make_cluster(K, caps, bw), K, stash_weights=sched == "1f1b")
    model = PipelineModel(p, sched, ga.microbatches)
    for o in [list(range(K))] + ([sorted(range(K), key=lambda d: -p.cap[d])] if caps else []):
        for s in [baselines.layerwise(p, o), baselines.balanced(p, o)] + baselines.pipedream_ties(p, o):
            assert ga.extra["model_ms"] <= model.time(s, o) * (1 + 1e-9)


def contiguous_splits(n, K):
    for cuts in itertools.combinations(range(1, n), K - 1):
        yield [0, *cuts, n]


@pytest.mark.parametrize("seed", range(8))
def test_pipedream_tie_breaks_are_optimal_and_minimise_the_spread(seed):
    rng = random.Random(seed)
    n, K = rng.randint(5, 9), rng.choice([2, 3, 4])
    # a chain with repeated costs and big activations: many ties at the bottleneck
    nodes = [
        Node(f"v{i}", rng.choice([1.0, 2.0]), rng.choice([1.0, 2.0]), 0.0, rng.choice([0.0, 1e6, 3e7]))
        for i in range(n)
    ]
    g = CostGraph(nodes, [(f"v{i}", f"v{i + 1}") for i in range(n - 1)])
    p = Problem(g, Cluster.homogeneous(K, bandwidth_gbps=10.0), K)
    devs = list(range(K))
    pref = [0.0]
    for v in p.order:
        pref.append(pref[-1] + p.comp[0][p.index[v]])
    cut = baselines.cut_bytes(p, list(range(n)))

    def costs(b):
        out = []
        for m in range(K):
            c = pref[b[m + 1]] - pref[b[m]]
            t_in = p.comm_ms(cut[b[m]], 0, 1) if m > 0 else 0.0
            t_out = p.comm_ms(cut[b[m + 1]], 0, 1) if m < K - 1 else 0.0
            out.append((max(c, t_in, t_out), c))
        return out

    splits = list(contiguous_splits(n, K))
    opt = min(max(c for c, _ in costs(b)) for b in splits)
    tied = [b for b in splits if max(c for c, _ in costs(b)) <= opt * (1 + 1e-9) + 1e-12]
    for tb, sec in (("cost2", 0), ("compute2", 1)):
        stage = baselines.pipedream(p, devs, tie_break=tb)
        b = [0] + [i + 1 for i in range(n - 1) if stage[i] != stage[i + 1]] + [n]
        assert max(c for c, _ in costs(b)) == pytest.approx(opt)
        want = min(sum(x[sec] ** 2 for x in costs(t)) for t in tied)
        assert sum(x[sec] ** 2 for x in costs(b)) == pytest.approx(want)


def test_1f1b_memory_counts_stashed_weights_and_a_plan_that_cannot_fit_says_so():
    g = CostGraph(
        [
            Node("a", 1, 1, param_bytes=100.0, activation_bytes=10.0),
            Node("b", 1, 1, param_bytes=50.0, activation_bytes=1.0),
            Node("c", 1, 1, param_bytes=20.0, activation_bytes=2.0),
        ],
        [("a", "b"), ("b", "c")],
    )
    cl = Cluster.homogeneous(3)
    ev = Problem(g, cl, 3, stash_weights=True).evaluate([0, 1, 2], [0, 1, 2])
    assert ev.stage_memory_bytes == [3 * 100 + 3 * 10, 2 * 50 + 2 * 1, 1 * 20 + 1 * 2]
    ev = Problem(g, cl, 3).evaluate([0, 1, 2], [0, 1, 2])
    assert ev.stage_memory_bytes == [100 + 3 * 10, 50 + 2 * 1, 20 + 2]
    # 200 bytes per device: every 1F1B plan puts a (3 versions of 100 B) or a+b (2 or 3 versions) too high
    plan = partition(g, 3, method="ga", memory=200.0, schedule="1f1b")
    assert plan.extra["feasible"] is False
    assert partition(g, 3, method="ga", memory=200.0, schedule="gpipe").extra["feasible"] is True


def test_the_partitioner_and_the_simulator_do_not_import_each_other():
    import importlib
    import pkgutil

    from tests.inprocess import TENSORFLOW, fresh_imports

    # in process: tf_commopt imported afresh with the other side blocked (BlockedImport names it)
    with fresh_imports(block=TENSORFLOW + ("tf_commopt.core.simulate", "tf_commopt.core.planner")):
        import tf_commopt.core.partition as P

        for m in pkgutil.walk_packages(P.__path__, "tf_commopt.core.partition."):
            importlib.import_module(m.name)
    with fresh_imports(block=TENSORFLOW + ("tf_commopt.core.partition",)):
        import tf_commopt.core.simulate.dataparallel
        import tf_commopt.core.simulate.engine
        import tf_commopt.core.simulate.pipeline
        import tf_commopt.core.simulate.result  # noqa: F401


def test_the_simulated_score_needs_the_planner():
    with pytest.raises(InputError, match="planner"):
        partition(branchy_graph(20, seed=0), 2, score="simulated")


def test_ga_with_one_stage_does_not_crash():
    # regression: the GA's frontier mutation indexed stage 1 of a one-stage plan (IndexError)
    from tf_commopt.core.profiles import load_profile
    from tf_commopt.partition import partition

    g = load_profile("pipedream/alexnet")
    plan = partition(g, 1, method="ga", seed=3)
    assert plan.num_stages == 1 and set(plan.stage_of_node.values()) == {0}
