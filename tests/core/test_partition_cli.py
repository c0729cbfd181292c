"""CLI of the partitioner: JSON on stdout, --out/--dot files, bad input -> exit 2 and one line."""

import json
import os

import pytest

from tests.inprocess import run_module
from tf_commopt.core.partition import PartitionPlan
from tf_commopt.core.planner import partition
from tf_commopt.core.profiles import load_profile
from tf_commopt.partition.__main__ import main


def test_cli_prints_plan_and_writes_out_and_dot(tmp_path, capsys):
    out, dot = str(tmp_path / "plan.json"), str(tmp_path / "plan.dot")
    rc = main(
        [
            "--profile",
            "pipedream/resnet50",
            "--stages",
            "4",
            "--method",
            "ga",
            "--capacities",
            "1,1,0.5,0.5",
            "--bandwidth-gbps",
            "25",
            "--seed",
            "1",
            "--out",
            out,
            "--dot",
            dot,
        ]
    )
    assert rc == 0
    captured = capsys.readouterr()
    d = json.loads(captured.out)
    for k in ("method", "stages", "max_stage_ms", "comm_bytes", "search_s", "stage_ms", "stage_of_node"):
        assert k in d
    assert d["method"] == "ga" and d["stages"] == 4 and len(d["stage_ms"]) == 4
    assert d["max_stage_ms"] == max(d["stage_ms"])
    assert len(d["stage_of_node"]) == 177 and "node1" in d["stage_of_node"]
    assert PartitionPlan.load(out).to_dict() == d
    text = open(dot).read()
    assert text.startswith("digraph") and text.count("fillcolor") == 177


def test_cli_memory_cap_warns_when_the_plan_does_not_fit(capsys):
    assert (
        main(
            ["--profile", "pipedream/vgg16", "--stages", "2", "--method", "balanced", "--memory-gb", "0.001"]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert json.loads(captured.out)["extra"]["feasible"] is False
    assert "warning: the plan exceeds the memory cap on stage(s)" in captured.err


def test_cli_kinds_from_h200(capsys):
    rc = main(["--profile", "h200/resnet50", "--stages", "2", "--method", "balanced", "--kinds", "bf16,fp32"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert sorted(d["extra"]["kinds"]) == ["bf16", "fp32"]


@pytest.mark.parametrize(
    "args,match",
    [
        (["--stages", "x"], "--stages: 'x' is not an integer"),
        (["--stages", "0"], "--stages: '0' must be positive"),
        (["--stages", "500"], "--stages: 500 stages for a graph of 41 nodes"),
        (["--method", "sa"], "--method: unknown method 'sa'"),
        (["--capacities", "1,-2"], "--capacities: item 1 '-2' must be a positive"),
        (["--capacities", "1"], "--stages: 2 stages need at least as many devices"),
        (["--bandwidth-gbps", "fast"], "--bandwidth-gbps: 'fast' is not a number"),
        (["--kinds", "bf16"], "--kinds: kind 'bf16' not in the profile"),
        (["--profile", "pipedream/nope"], "unknown bundled profile 'pipedream/nope'"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(args, match, capsys):
    base = {"--profile": "pipedream/vgg16", "--stages": "2"}
    argv = []
    for k, v in base.items():
        if k not in args:
            argv += [k, v]
    assert main(argv + args) == 2
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1


def test_python_m_bad_file_line(tmp_path):
    p = tmp_path / "g.graph.txt"
    p.write_text(
        "node1 -- A -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=1\n"
        "\tnode1 -- node2\n"
    )
    r = run_module("tf_commopt.partition", ["--profile", str(p), "--stages", "1"])
    assert r.code == 2 and r.out == ""
    assert r.err.strip() == f"{p}:2: unknown node 'node2'"
    r = run_module("tf_commopt.partition", ["--profile", str(p)])
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "--stages" in r.err


# ------------------------------------------------------------------ external assignments (--method given)
def _with_stage_ids(tmp_path, plan_stage, name="pd.graph.txt", drop=None):
    """PipeDream's bundled vgg16 profile with ``stage_id=N`` appended to each node line (as its optimizer writes)."""
    from tf_commopt.core.profiles import bundled_profile_path

    lines = []
    for raw in open(bundled_profile_path("pipedream/vgg16"), encoding="utf-8").read().splitlines():
        if raw and raw[0] not in "\t " and raw.split(" -- ", 1)[0] != drop:
            raw = f"{raw}, stage_id={plan_stage[raw.split(' -- ', 1)[0]]}"
        lines.append(raw)
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_method_given_scores_a_pipedream_assignment_like_any_plan(tmp_path, capsys):
    from tf_commopt.core.devices import Cluster
    from tf_commopt.core.planner import given_plan, read_stage_ids
    from tf_commopt.core.simulate import simulate_pipeline

    g = load_profile("pipedream/vgg16")
    ref = partition(g, 4, method="pipedream", bandwidth_gbps=10.0)
    # PipeDream numbers stages with gaps sometimes: ids 0, 2, 4, 6 must become 0..3
    path = _with_stage_ids(tmp_path, {n: 2 * s for n, s in ref.stage_of_node.items()})
    assert read_stage_ids(path) == {n: 2 * s for n, s in ref.stage_of_node.items()}
    assert main(["--profile", path, "--method", "given", "--quiet"]) == 0  # the profile carries the ids
    d = json.loads(capsys.readouterr().out)
    assert d["method"] == "given" and d["stage_of_node"] == ref.stage_of_node and d["schedule"] == "gpipe"
    want = simulate_pipeline(
        g, ref, "gpipe", microbatches=16, cluster=Cluster.homogeneous(4, 10.0)
    ).iteration_ms
    assert d["extra"]["simulated_ms"] == pytest.approx(want, rel=1e-12)
    assert d["objective"] == pytest.approx(ref.objective)
    # the same through --assignment with a bundled profile, and from Python
    assert main(["--profile", "pipedream/vgg16", "--method", "given", "--assignment", path, "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["stage_of_node"] == ref.stage_of_node
    assert given_plan(g, path).stage_of_node == ref.stage_of_node


def test_method_given_bad_assignments_are_one_line_errors(tmp_path, capsys):
    g = load_profile("pipedream/vgg16")
    ref = partition(g, 4, method="balanced", bandwidth_gbps=10.0)
    first = g.topological_order()[0]
    last = g.topological_order()[-1]
    missing = _with_stage_ids(tmp_path, ref.stage_of_node, "missing.graph.txt", drop=last)
    back = dict(ref.stage_of_node)
    back[first] = 3  # the input on the last stage: edges go back
    backwards = _with_stage_ids(tmp_path, back, "back.graph.txt")
    for argv, needle in (
        (["--assignment", missing], repr(last)),
        (["--assignment", backwards], "back"),
        (["--assignment", str(tmp_path / "none.txt")], "none.txt"),
        (["--assignment", missing, "--stages", "4"], repr(last)),
        (["--stages", "4", "--assignment", backwards, "--method", "ga"], "--assignment"),
    ):
        argv = ["--profile", "pipedream/vgg16", "--method", "given", "--quiet"] + argv
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err, (argv, err)
    ok = _with_stage_ids(tmp_path, ref.stage_of_node, "ok.graph.txt")
    assert (
        main(["--profile", "pipedream/vgg16", "--method", "given", "--assignment", ok, "--stages", "3"]) == 2
    )
    assert "--stages" in capsys.readouterr().err


def test_plan_json_round_trip_keeps_the_cluster_and_old_files_load():
    from tf_commopt.core.plan import PartitionPlan
    from tf_commopt.errors import PlanError

    plan = partition(
        load_profile("pipedream/alexnet"),
        2,
        method="balanced",
        capacities=[1.0, 0.5, 2.0],
        bandwidth_gbps=25.0,
        latency_ms=0.2,
        memory=[1e10, None, 2e10],
        schedule="1f1b",
    )
    back = PartitionPlan.from_json(plan.to_json())
    assert back == plan and back.cluster == {
        "capacities": [1.0, 0.5, 2.0],
        "kinds": [None, None, None],
        "bandwidth_gbps": 25.0,
        "latency_ms": 0.2,
        "memory_bytes": [1e10, None, 2e10],
    }
    assert back.schedule == "1f1b" and back.microbatches == 16
    d = json.loads(plan.to_json())
    for k in ("cluster", "schedule", "microbatches"):
        del d[k]
    old = PartitionPlan.from_dict(d)
    assert old.cluster is None and old.schedule is None and old.stage_of_node == plan.stage_of_node
    d["cluster"] = {"capacities": [1.0]}
    with pytest.raises(PlanError, match="cluster.capacities"):
        PartitionPlan.from_dict(d)


def test_pipedream_optimizer_format_with_a_stage_field_loads_as_profile_and_plan(tmp_path, capsys):
    # PipeDream's optimizer writes "name -- desc -- costs -- stage_id=N"; the file is both profile and plan
    from tf_commopt.core.profiles import bundled_profile_path

    g = load_profile("pipedream/vgg16")
    ref = partition(g, 3, method="balanced", bandwidth_gbps=10.0)
    lines = []
    for raw in open(bundled_profile_path("pipedream/vgg16"), encoding="utf-8").read().splitlines():
        if raw and raw[0] not in "\t ":
            raw = f"{raw} -- stage_id={ref.stage_of_node[raw.split(' -- ', 1)[0]]}"
        lines.append(raw)
    path = tmp_path / "vgg16.graph.txt"
    path.write_text("\n".join(lines) + "\n")
    assert main(["--profile", str(path), "--method", "given", "--quiet"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["stage_of_node"] == ref.stage_of_node and d["graph_name"] == "vgg16"
    # a broken line in such a file is reported against the user's file, not a temporary copy
    lines[0] = lines[0].replace("forward_compute_time=", "forward_compute_time=x")
    path.write_text("\n".join(lines) + "\n")
    assert main(["--profile", str(path), "--method", "given", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and ".profile-" not in err


def test_cli_summary_on_stderr_and_format_text(capsys):
    assert main(["--profile", "pipedream/vgg16", "--stages", "3", "--method", "balanced"]) == 0
    captured = capsys.readouterr()
    d = json.loads(captured.out)
    table = [x for x in captured.err.splitlines() if x.split()[:1] and x.split()[0].isdigit()]
    assert "stage device  nodes" in captured.err and len(table) == 3
    assert sum(int(x.split()[2]) for x in table) == len(d["stage_of_node"])
    assert [float(x.split()[3]) for x in table] == [round(v, 1) for v in d["stage_ms"]]
    assert (
        main(
            [
                "--profile",
                "pipedream/vgg16",
                "--stages",
                "3",
                "--method",
                "balanced",
                "--format",
                "text",
                "--quiet",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert captured.out.startswith("balanced plan, 3 stage(s)") and "stage device" in captured.out
    assert "stage device" not in captured.err
    assert main(["--profile", "pipedream/vgg16", "--stages", "3", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "stage device" not in err and "ga [" not in err  # only notes and warnings remain


def test_cli_out_and_dot_have_normal_permissions(tmp_path, capsys):
    old = os.umask(0o022)
    try:
        out, dot = tmp_path / "plan.json", tmp_path / "plan.dot"
        assert (
            main(
                [
                    "--profile",
                    "pipedream/alexnet",
                    "--stages",
                    "2",
                    "--method",
                    "balanced",
                    "--quiet",
                    "--out",
                    str(out),
                    "--dot",
                    str(dot),
                ]
            )
            == 0
        )
    finally:
        os.umask(old)
    assert oct(out.stat().st_mode & 0o777) == oct(0o644) and oct(dot.stat().st_mode & 0o777) == oct(0o644)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".plan-")] == []


def test_cli_ga_progress_ends_at_the_generation_it_stopped(capsys):
    assert main(["--profile", "pipedream/vgg16", "--stages", "4", "--method", "ga"]) == 0
    err = capsys.readouterr().err
    gens = [x for x in err.splitlines() if x.startswith("ga [")]
    last = gens[-1]
    k, total = last.split(" gen ")[1].split()[0].split("/")
    if int(k) < int(total):
        assert f"stopped early at gen {k}/{total}" in last, gens
    assert len(gens) == len(set(gens)), gens  # the end is not printed twice
