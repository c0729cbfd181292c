"""experiments.harness: a sweep runs its variants interleaved within each repeat and records one line per
setting with its runs, summary, command and machine load (launches replaced by a fake runner)."""

import json

from experiments import harness


def test_sweep_interleaves_variants_and_records_each_setting(tmp_path, monkeypatch):
    order = []

    def fake_launch(run):
        order.append(tuple(run.argv))
        return {"wall_s": float(len(order)), "extra": "dropped"}

    monkeypatch.setattr(harness, "launch", fake_launch)
    sweep = harness.Sweep(
        "demo",
        settings=["a", "b"],
        variants=["x", "y"],
        repeats=2,
        launch=lambda s, v: harness.Launch([s, v]),
        keep=("wall_s",),
        describe=lambda s: {"name": s.upper()},
        summarize=lambda s, runs: {"n": sum(len(r) for r in runs.values())},
        extra={"fixed": 1},
    )
    out = tmp_path / "r.jsonl"
    recs = harness.run_sweep(sweep, str(out), "python -m experiments.demo_bench --x", echo=lambda line: None)
    assert order == [("a", "x"), ("a", "y")] * 2 + [("b", "x"), ("b", "y")] * 2
    assert [json.loads(line) for line in out.read_text().splitlines()] == recs
    a = recs[0]
    assert a["runs"] == {"x": [{"wall_s": 1.0}, {"wall_s": 3.0}], "y": [{"wall_s": 2.0}, {"wall_s": 4.0}]}
    assert (a["bench"], a["setting"], a["name"], a["fixed"], a["repeats"], a["n"]) == (
        "demo",
        "a",
        "A",
        1,
        2,
        4,
    )
    assert a["command"] == "python -m experiments.demo_bench --x"
    assert isinstance(a["load_average_1m"], float) and a["cores"] >= 1 and a["when"].endswith("Z")


def test_json_lines_reads_records_and_skips_the_rest():
    lines = ['{"a": 1}', 'RESULT {"b": 2}', "Epoch 1/1", "{not json}", "PROC {}"]
    assert harness.json_lines(lines) == [{"a": 1}, {"b": 2}]
