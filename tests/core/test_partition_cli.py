"""CLI of the partitioner: JSON on stdout, --out/--dot files, bad input -> exit 2 and one line."""
import json
import os
import subprocess
import sys

import pytest

from tf_commopt.core.partition import PartitionPlan
from tf_commopt.partition.__main__ import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_cli_prints_plan_and_writes_out_and_dot(tmp_path, capsys):
    out, dot = str(tmp_path / "plan.json"), str(tmp_path / "plan.dot")
    rc = main(["--profile", "pipedream/resnet50", "--stages", "4", "--method", "ga", "--capacities", "1,1,0.5,0.5",
               "--bandwidth-gbps", "25", "--seed", "1", "--out", out, "--dot", dot])
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
    assert main(["--profile", "pipedream/vgg16", "--stages", "2", "--method", "balanced", "--memory-gb", "0.001"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["extra"]["feasible"] is False
    assert "warning: the plan exceeds the memory cap on stage(s)" in captured.err


def test_cli_kinds_from_h200(capsys):
    rc = main(["--profile", "h200/resnet50", "--stages", "2", "--method", "balanced", "--kinds", "bf16,fp32"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert sorted(d["extra"]["kinds"]) == ["bf16", "fp32"]


@pytest.mark.parametrize("args,match", [
    (["--stages", "x"], "--stages: 'x' is not an integer"),
    (["--stages", "0"], "--stages: '0' must be positive"),
    (["--stages", "500"], "--stages: 500 stages for a graph of 41 nodes"),
    (["--method", "sa"], "--method: unknown method 'sa'"),
    (["--capacities", "1,-2"], "--capacities: item 1 '-2' must be a positive"),
    (["--capacities", "1"], "--stages: 2 stages need at least as many devices"),
    (["--bandwidth-gbps", "fast"], "--bandwidth-gbps: 'fast' is not a number"),
    (["--kinds", "bf16"], "--kinds: kind 'bf16' not in the profile"),
    (["--profile", "pipedream/nope"], "unknown bundled profile 'pipedream/nope'"),
])
def test_cli_bad_input_exits_2_with_one_line(args, match, capsys):
    base = {"--profile": "pipedream/vgg16", "--stages": "2"}
    argv = []
    for k, v in base.items():
        if k not in args:
            argv += [k, v]
    assert main(argv + args) == 2
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1


def test_cli_subprocess_bad_file_line(tmp_path):
    p = tmp_path / "g.graph.txt"
    p.write_text("node1 -- A -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=1\n"
                 "\tnode1 -- node2\n")
    r = subprocess.run([sys.executable, "-m", "tf_commopt.partition", "--profile", str(p), "--stages", "1"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == f"{p}:2: unknown node 'node2'"
    r = subprocess.run([sys.executable, "-m", "tf_commopt.partition", "--profile", str(p)],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--stages" in r.stderr
