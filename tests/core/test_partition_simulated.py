"""``partition(..., score="simulated")``: the returned plan is never slower in the simulator than any
baseline plan (layerwise, balanced, pipedream) on the same setting; the default is unchanged."""
import json

import pytest

from tf_commopt.core.partition import evaluate, make_cluster, partition
from tf_commopt.core.partition.synthetic import branchy_graph
from tf_commopt.core.profiles import load_profile
from tf_commopt.core.simulate import simulate_pipeline
from tf_commopt.errors import InputError
from tf_commopt.partition.__main__ import main

BASELINES = ("layerwise", "balanced", "pipedream")


def sim_ms(graph, plan, schedule, m, cluster):
    """Independent reference: the simulator's ms per mini-batch (GPipe iteration, 1F1B 1000/throughput)."""
    r = simulate_pipeline(graph, plan, schedule, microbatches=m, cluster=cluster)
    return r.iteration_ms if schedule == "gpipe" else 1000.0 / r.throughput


CASES = [  # graph seed, nodes, K, capacities, Gbit/s, schedule, method
    (1, 60, 3, None, 1.0, "gpipe", "ga"),
    (2, 80, 4, None, 10.0, "1f1b", "ga"),
    (3, 50, 4, [1.0, 1.0, 0.5, 0.25], 10.0, "gpipe", "ga"),
    (4, 70, 3, [2.0, 1.0, 0.5], 100.0, "1f1b", "ga"),
    (5, 60, 4, None, 100.0, "gpipe", "local"),
    (6, 60, 3, [1.0, 0.5, 0.5], 1.0, "1f1b", "local"),
]


@pytest.mark.parametrize("gseed,n,k,caps,bw,schedule,method", CASES)
def test_simulated_score_is_never_worse_than_any_baseline_in_simulation(gseed, n, k, caps, bw, schedule, method):
    g = branchy_graph(n, seed=gseed, act_mb=2.0)
    m = 2 * k + 1
    cl = make_cluster(k, caps, bandwidth_gbps=bw)
    plan = partition(g, k, method=method, capacities=caps, bandwidth_gbps=bw, seed=0, score="simulated",
                     schedule=schedule, microbatches=m)
    got = sim_ms(g, plan, schedule, m, cl)
    assert plan.extra["simulated_ms"] == pytest.approx(got, rel=1e-9)
    assert plan.extra["score"] == "simulated" and plan.extra["schedule"] == schedule and plan.extra["microbatches"] == m
    for base in BASELINES:
        bp = partition(g, k, method=base, capacities=caps, bandwidth_gbps=bw)
        assert got <= sim_ms(g, bp, schedule, m, cl) * (1 + 1e-9), base
    # the objective-scored plan of the same search is a candidate too
    op = partition(g, k, method=method, capacities=caps, bandwidth_gbps=bw, seed=0)
    assert got <= sim_ms(g, op, schedule, m, cl) * (1 + 1e-9)
    assert plan.extra["objective_best_simulated_ms"] >= got * (1 - 1e-9)
    # a valid, convex plan whose reported numbers are the objective's
    ref = evaluate(g, plan.stage_of_node, plan.device_of_stage, capacities=caps, bandwidth_gbps=bw)
    assert ref.objective == pytest.approx(plan.objective) and ref.comm_bytes == pytest.approx(plan.comm_bytes)


def test_real_profile_where_the_objective_and_the_simulator_disagree():
    # pipedream/vgg16, 4 stages, 10 Gbit/s: the objective's favourite (a low-traffic plan) is ~40% slower
    # in GPipe than PipeDream's DP plan, which models overlap; the simulated score must not be.
    g = load_profile("pipedream/vgg16")
    cl = make_cluster(4, None, bandwidth_gbps=10.0)
    by_obj = partition(g, 4, method="ga", bandwidth_gbps=10.0)
    by_sim = partition(g, 4, method="ga", bandwidth_gbps=10.0, score="simulated", schedule="gpipe")
    pd = partition(g, 4, method="pipedream", bandwidth_gbps=10.0)
    t_obj, t_sim, t_pd = (sim_ms(g, p, "gpipe", 16, cl) for p in (by_obj, by_sim, pd))
    assert t_sim < 0.9 * t_obj
    assert t_sim <= t_pd * (1 + 1e-9)
    assert by_sim.objective >= by_obj.objective * (1 - 1e-9)   # it trades the objective for simulated time
    assert by_sim.extra["microbatches"] == 16                   # default 4 K for GPipe


def test_default_is_unchanged_and_baselines_ignore_the_score():
    g = branchy_graph(50, seed=7)
    a = partition(g, 3, method="ga", seed=2)
    b = partition(g, 3, method="ga", seed=2, score="objective", schedule="1f1b", microbatches=5)
    assert a.stage_of_node == b.stage_of_node and a.device_of_stage == b.device_of_stage
    assert "score" not in a.extra and "population" not in a.extra
    for base in BASELINES:
        x = partition(g, 3, method=base)
        y = partition(g, 3, method=base, score="simulated")
        assert x.stage_of_node == y.stage_of_node and "score" not in y.extra
    c = partition(g, 3, method="ga", seed=2, score="simulated", schedule="1f1b")
    d = partition(g, 3, method="ga", seed=2, score="simulated", schedule="1f1b")
    assert c.stage_of_node == d.stage_of_node and c.extra["microbatches"] == 24   # deterministic; 8 K for 1F1B


@pytest.mark.parametrize("kwargs,where", [({"score": "sim"}, "score"), ({"schedule": "zb"}, "schedule"),
                                          ({"microbatches": 0}, "microbatches"),
                                          ({"microbatches": 2.5}, "microbatches")])
def test_bad_score_arguments(kwargs, where):
    with pytest.raises(InputError, match=where):
        partition(branchy_graph(20, seed=0), 2, method="ga", **kwargs)


def test_cli_score_simulated(capsys):
    rc = main(["--profile", "pipedream/alexnet", "--stages", "2", "--score", "simulated", "--schedule", "1f1b",
               "--microbatches", "6", "--quiet"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["extra"]["score"] == "simulated" and d["extra"]["schedule"] == "1f1b" and d["extra"]["microbatches"] == 6


@pytest.mark.parametrize("argv,flag", [(["--score", "fast"], "--score"), (["--schedule", "zb"], "--schedule"),
                                       (["--microbatches", "x"], "--microbatches")])
def test_cli_bad_score_flags_exit_2_with_one_line(argv, flag, capsys):
    rc = main(["--profile", "pipedream/alexnet", "--stages", "2", "--quiet"] + argv)
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and flag in err
