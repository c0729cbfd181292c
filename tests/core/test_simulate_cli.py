"""``python -m tf_commopt.sim``: one JSON object, a Gantt PNG, exit 2 with one line on bad input."""

import json

import pytest

from tests.inprocess import run_module
from tf_commopt.core.plan import PartitionPlan
from tf_commopt.core.profiles import bundled_profile_path, load_profile
from tf_commopt.core.simulate import simulate_pipeline
from tf_commopt.sim import main


@pytest.fixture(scope="module")
def vgg_plan(tmp_path_factory):
    g = load_profile(bundled_profile_path("pipedream/vgg16"))
    order = g.topological_order()
    son = {n: min(3, i * 4 // len(order)) for i, n in enumerate(order)}
    plan = PartitionPlan("manual", son, [0, 1, 2, 3], [0.0] * 4, [0.0] * 4, [0.0] * 4, 0.0, 0.0)
    path = str(tmp_path_factory.mktemp("plan") / "plan.json")
    plan.save(path)
    return g, plan, path


def test_cli_prints_the_library_result(vgg_plan, capsys, tmp_path):
    g, plan, path = vgg_plan
    png = str(tmp_path / "t.png")
    rc = main(
        [
            "--profile",
            "pipedream/vgg16",
            "--plan",
            path,
            "--schedule",
            "gpipe",
            "--microbatches",
            "4",
            "--bandwidth-gbps",
            "25",
            "--png",
            png,
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    want = simulate_pipeline(g, plan, "gpipe", 4, bandwidth_gbps=25.0)
    for k in ("iteration_ms", "throughput", "bubble_fraction", "bytes_injected"):
        assert out[k] == pytest.approx(getattr(want, k))
    assert out["schedule"] == "gpipe"
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    assert matplotlib.image.imread(png).shape[1] > 600


def test_cli_1f1b_and_capacities(vgg_plan, capsys):
    _, _, path = vgg_plan
    assert (
        main(
            [
                "--profile",
                "pipedream/vgg16",
                "--plan",
                path,
                "--schedule",
                "1f1b",
                "--microbatches",
                "20",
                "--capacities",
                "1,2,2,2",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["schedule"] == "1f1b" and out["throughput"] > 0 and out["split"] == 1.0


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--schedule", "zigzag"], "--schedule"),
        (["--microbatches", "0"], "--microbatches"),
        (["--profile", "no/such.txt"], "no/such.txt"),
        (["--capacities", "1,x"], "--capacities"),
        (["--capacities", "1"], "cluster has 1"),
    ],
)
def test_cli_bad_input_one_line(vgg_plan, capsys, args, msg):
    _, _, path = vgg_plan
    base = {"--profile": "pipedream/vgg16", "--plan": path, "--schedule": "gpipe", "--microbatches": "4"}
    base.update(dict(zip(args[::2], args[1::2])))
    assert main([x for kv in base.items() for x in kv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and msg in err


def test_python_m_exit_code(vgg_plan, tmp_path):
    bad = tmp_path / "plan.json"
    bad.write_text('{"method": "x",\n "stage_of_node": []}')
    argv = ["--profile", "pipedream/vgg16", "--plan", str(bad), "--schedule", "gpipe", "--microbatches", "2"]
    r = run_module("tf_commopt.sim", argv)
    assert r.code == 2 and r.out == ""
    assert r.err.count("\n") == 1 and str(bad) in r.err, r.err


def test_plan_from_the_partition_cli(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    r = run_module(
        "tf_commopt.partition",
        [
            "--profile",
            "h200/resnet50",
            "--stages",
            "4",
            "--method",
            "balanced",
            "--kinds",
            "bf16",
            "--schedule",
            "1f1b",
            "--microbatches",
            "16",
            "--out",
            str(plan),
            "--quiet",
        ],
    )
    assert r.code == 0, r.err
    assert (
        main(
            [
                "--profile",
                "h200/resnet50",
                "--plan",
                str(plan),
                "--schedule",
                "1f1b",
                "--microbatches",
                "16",
                "--kinds",
                "bf16",
            ]
        )
        == 0
    )  # flags that agree with the plan are fine
    out = json.loads(capsys.readouterr().out)
    assert out["schedule"] == "1f1b" and out["bytes_injected"] > 0
    assert main(["--profile", "h200/resnet50", "--plan", str(plan), "--kinds", "int4"]) == 2
    assert "int4" in capsys.readouterr().err


def test_sim_uses_the_cluster_schedule_and_microbatches_the_plan_records(tmp_path, capsys):
    # the README's example: a plan for half-speed devices must be simulated on them (not on equal devices)
    from tf_commopt.partition.__main__ import main as partition_main

    path = tmp_path / "plan.json"
    assert (
        partition_main(
            [
                "--profile",
                "pipedream/alexnet",
                "--stages",
                "3",
                "--capacities",
                "1,1,0.5",
                "--bandwidth-gbps",
                "25",
                "--latency-ms",
                "0.1",
                "--out",
                str(path),
                "--quiet",
            ]
        )
        == 0
    )
    made = json.loads(capsys.readouterr().out)
    assert main(["--profile", "pipedream/alexnet", "--plan", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schedule"] == "gpipe" and out["num_microbatches"] == 12
    assert out["iteration_ms"] == pytest.approx(made["extra"]["simulated_ms"], rel=1e-9)
    assert out["bandwidth_gbps"] == 25.0 and out["latency_ms"] == 0.1
    for flag, value in (
        ("--bandwidth-gbps", "10"),
        ("--latency-ms", "0"),
        ("--capacities", "1,1,1"),
        ("--schedule", "1f1b"),
        ("--microbatches", "8"),
    ):
        assert main(["--profile", "pipedream/alexnet", "--plan", str(path), flag, value]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and flag in err and "contradicts" in err
    # a plan file from before the record: loads, equal devices by default, schedule required
    old = json.loads(path.read_text())
    for k in ("cluster", "schedule", "microbatches"):
        del old[k]
    path.write_text(json.dumps(old))
    assert main(["--profile", "pipedream/alexnet", "--plan", str(path)]) == 2
    assert "--schedule" in capsys.readouterr().err
    assert (
        main(
            [
                "--profile",
                "pipedream/alexnet",
                "--plan",
                str(path),
                "--schedule",
                "gpipe",
                "--microbatches",
                "12",
                "--capacities",
                "1,1,0.5",
                "--bandwidth-gbps",
                "25",
                "--latency-ms",
                "0.1",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["iteration_ms"] == pytest.approx(made["extra"]["simulated_ms"])
