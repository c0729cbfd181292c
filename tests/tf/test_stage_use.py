"""Idle stages: the plan and the partition CLI say how many stages are busy, why, and the break-even bandwidth.

The break-even bandwidth is checked against the project's own objective (core.partition.api.evaluate):
just above it the named 2-stage split beats one stage, just below it it does not.
"""

import json

import pytest

from tf_commopt.core.costgraph import CostGraph, Node
from tf_commopt.core.partition.api import evaluate
from tf_commopt.core.profiles import load_profile
from tf_commopt.tf.stage_use import break_even, idle_stage_report


def _split_objective(g, cut_after, bw, lat=0.0):
    order = g.topological_order()
    k = order.index(cut_after)
    stage = {n: (0 if i <= k else 1) for i, n in enumerate(order)}
    return evaluate(g, stage, bandwidth_gbps=bw, latency_ms=lat).objective


def test_chain_closed_form():
    g = CostGraph(
        [Node("a", 1, 2, activation_bytes=12.5e6), Node("b", 2, 4, activation_bytes=1e6), Node("c", 1, 2)],
        [("a", "b"), ("b", "c")],
    )
    r = break_even(g)
    # cut after a: 2 * 12.5e6 B / (12 - 3) ms; cut after b: 2 * 1e6 / (12 - 9) ms -> the second is cheaper
    assert r["cut_after"] == "b" and r["cut_bytes"] == 1e6
    assert r["bandwidth_gbps"] == pytest.approx(2 * 1e6 / 3 * 8e-6)
    r_lat = break_even(g, latency_ms=1.0)  # slack 3 - 2 ms
    assert r_lat["bandwidth_gbps"] == pytest.approx(2 * 1e6 / 1 * 8e-6)


def test_skip_connections_count_on_every_cut_they_cross():
    g = CostGraph(
        [Node("x", 0, 0, activation_bytes=5e6), Node("y", 1, 1, activation_bytes=1e6), Node("z", 1, 1)],
        [("x", "y"), ("y", "z"), ("x", "z")],
    )
    r = break_even(g)  # a cut after the zero-cost input moves no compute
    assert r["cut_after"] == "y" and r["cut_bytes"] == 6e6  # x's tensor is relayed past y
    assert r["bandwidth_gbps"] == pytest.approx(2 * 6e6 / 2 * 8e-6)
    assert (
        _split_objective(g, "y", r["bandwidth_gbps"] * 1.01)
        < 4
        < _split_objective(g, "y", r["bandwidth_gbps"] * 0.99)
    )


@pytest.mark.parametrize("model", ["resnet50.fp32", "vgg16.bf16"])
def test_break_even_matches_the_objective(model):
    g = load_profile(f"h200/{model}")
    r = break_even(g)
    T = r["total_compute_ms"]
    bw = r["bandwidth_gbps"]
    assert _split_objective(g, r["cut_after"], bw * 1.01) < T
    assert _split_objective(g, r["cut_after"], bw * 0.99) > T


def test_cli_says_why_stages_are_idle(capsys):
    from tf_commopt.partition.__main__ import main

    g = load_profile("h200/resnet50.fp32")
    be = break_even(g)["bandwidth_gbps"]
    assert (
        main(
            [
                "--profile",
                "h200/resnet50.fp32",
                "--stages",
                "8",
                "--method",
                "local",
                "--bandwidth-gbps",
                str(be / 10),
                "--quiet",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    plan = json.loads(out)
    assert plan["extra"]["busy_stages"] == 1 and len(plan["extra"]["idle_stages"]) == 7
    assert plan["extra"]["break_even_gbps"] == pytest.approx(be)
    assert "only 1 of 8 stages is busy" in err and "links too slow to pipeline this model" in err
    assert f"pipelining starts to pay above {be:.3g} Gbit/s" in err and err.count("\n") == 1


def test_busy_plans_say_nothing(capsys):
    from tf_commopt.partition.__main__ import main

    assert (
        main(
            [
                "--profile",
                "h200/resnet50.fp32",
                "--stages",
                "2",
                "--method",
                "balanced",
                "--bandwidth-gbps",
                "1000",
                "--quiet",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert "busy_stages" not in json.loads(out)["extra"] and err == ""


def test_report_none_when_all_busy():
    g = CostGraph([Node("a", 1, 1, activation_bytes=1.0), Node("b", 1, 1)], [("a", "b")])
    plan = evaluate(g, {"a": 0, "b": 1}, bandwidth_gbps=10)
    assert idle_stage_report(g, plan, 10) is None
