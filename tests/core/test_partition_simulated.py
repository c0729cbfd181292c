"""The planner's ``partition`` (default ``score="simulated"``): the returned plan is never slower in the
simulator than any baseline plan (layerwise, balanced, pipedream) on the same setting; it records the
cluster, schedule and micro-batches it was made for."""

import json

import pytest

from tf_commopt.core.partition import evaluate, make_cluster
from tf_commopt.core.partition import partition as search
from tf_commopt.core.partition.synthetic import branchy_graph
from tf_commopt.core.planner import partition
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
def test_simulated_score_is_never_worse_than_any_baseline_in_simulation(
    gseed, n, k, caps, bw, schedule, method
):
    g = branchy_graph(n, seed=gseed, act_mb=2.0)
    m = 2 * k + 1
    cl = make_cluster(k, caps, bandwidth_gbps=bw)
    plan = partition(
        g, k, method=method, capacities=caps, bandwidth_gbps=bw, seed=0, schedule=schedule, microbatches=m
    )
    got = sim_ms(g, plan, schedule, m, cl)
    assert plan.extra["simulated_ms"] == pytest.approx(got, rel=1e-9)
    assert plan.extra["score"] == "simulated" and plan.schedule == schedule and plan.microbatches == m
    assert plan.cluster["capacities"] == (caps or [1.0] * k) and plan.cluster["bandwidth_gbps"] == bw
    for base in BASELINES:
        for score in ("simulated", "pipeline", "objective"):
            bp = partition(
                g,
                k,
                method=base,
                capacities=caps,
                bandwidth_gbps=bw,
                schedule=schedule,
                microbatches=m,
                score=score,
            )
            assert got <= sim_ms(g, bp, schedule, m, cl) * (1 + 1e-9), (base, score)
    # a valid, convex plan whose reported numbers are the objective's
    ref = evaluate(g, plan.stage_of_node, plan.device_of_stage, capacities=caps, bandwidth_gbps=bw)
    assert ref.objective == pytest.approx(plan.objective) and ref.comm_bytes == pytest.approx(plan.comm_bytes)


def test_real_profile_where_the_objective_and_the_simulator_disagree():
    # pipedream/vgg16, 4 stages, 10 Gbit/s: the objective's favourite (a low-traffic plan) is ~40% slower
    # in GPipe than PipeDream's DP plan, which models overlap; the default must not be.
    g = load_profile("pipedream/vgg16")
    cl = make_cluster(4, None, bandwidth_gbps=10.0)
    by_obj = partition(g, 4, method="ga", bandwidth_gbps=10.0, score="objective")
    by_sim = partition(g, 4, method="ga", bandwidth_gbps=10.0)
    pd = partition(g, 4, method="pipedream", bandwidth_gbps=10.0, score="objective")
    t_obj, t_sim, t_pd = (sim_ms(g, p, "gpipe", 16, cl) for p in (by_obj, by_sim, pd))
    assert t_sim < 0.9 * t_obj
    assert t_sim <= t_pd * (1 + 1e-9)
    assert by_sim.objective >= by_obj.objective * (1 - 1e-9)  # it trades the objective for simulated time
    assert by_sim.microbatches == 16  # default 4 K for GPipe
    # GPipe: the closed-form model is exact, so the pipeline score picks a plan exactly as fast
    by_model = partition(g, 4, method="ga", bandwidth_gbps=10.0, score="pipeline")
    assert sim_ms(g, by_model, "gpipe", 16, cl) == pytest.approx(t_sim, rel=1e-9)


def test_deterministic_and_default_microbatches():
    g = branchy_graph(50, seed=7)
    c = partition(g, 3, method="ga", seed=2, schedule="1f1b")
    d = partition(g, 3, method="ga", seed=2, schedule="1f1b")
    assert c.stage_of_node == d.stage_of_node and c.microbatches == 24  # deterministic; 8 K for 1F1B
    o = partition(g, 3, method="ga", seed=2, score="objective")
    assert o.extra["score"] == "objective" and "population" not in o.extra


@pytest.mark.parametrize(
    "kwargs,where",
    [
        ({"score": "sim"}, "score"),
        ({"schedule": "zb"}, "schedule"),
        ({"microbatches": 0}, "microbatches"),
        ({"microbatches": 2.5}, "microbatches"),
    ],
)
def test_bad_score_arguments(kwargs, where):
    with pytest.raises(InputError, match=where):
        partition(branchy_graph(20, seed=0), 2, method="ga", **kwargs)
    with pytest.raises(InputError, match=where):
        search(branchy_graph(20, seed=0), 2, method="ga", **kwargs)


def test_cli_default_is_simulated_and_records_the_setting(capsys):
    rc = main(
        [
            "--profile",
            "pipedream/alexnet",
            "--stages",
            "2",
            "--schedule",
            "1f1b",
            "--microbatches",
            "6",
            "--capacities",
            "1,0.5",
            "--bandwidth-gbps",
            "25",
            "--quiet",
        ]
    )
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["extra"]["score"] == "simulated" and d["schedule"] == "1f1b" and d["microbatches"] == 6
    assert d["cluster"]["capacities"] == [1.0, 0.5] and d["cluster"]["bandwidth_gbps"] == 25.0


@pytest.mark.parametrize(
    "argv,flag",
    [
        (["--score", "fast"], "--score"),
        (["--schedule", "zb"], "--schedule"),
        (["--microbatches", "x"], "--microbatches"),
    ],
)
def test_cli_bad_score_flags_exit_2_with_one_line(argv, flag, capsys):
    rc = main(["--profile", "pipedream/alexnet", "--stages", "2", "--quiet"] + argv)
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and flag in err
