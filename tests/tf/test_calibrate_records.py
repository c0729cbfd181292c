"""``python -m tf_commopt.tf.calibrate --jsonl``: one record per printed row, merged into the file by key,
and the page docs/results/calibration.md rendered from those records shows the rows the CLI prints.

References: the estimate's errors computed directly (``layer_errors`` / ``stage_errors``), the CLI's own
printed tables (formatted by other code than the page), and hand-built records for the merge rules."""

import json

import pytest

from tf_commopt.core.profiles import load_profile
from tf_commopt.tf.calibrate import MODELS, estimate_profile, layer_errors, stage_errors
from tf_commopt.tf.calibrate.records import merge_jsonl
from tf_commopt.tf.calibrate.report import main
from tf_commopt.tf.devices import roofline_preset

pytestmark = pytest.mark.filterwarnings("ignore::tf_commopt.tf.op_costs.CostEstimateWarning")


def _read(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_merge_replaces_the_same_row_keeps_the_others_and_orders_them(tmp_path):
    path = str(tmp_path / "c.jsonl")
    a = {"table": "layers", "model": "vgg16", "mode": "fp32", "roofline": "fitted", "v": 1}
    b = {"table": "keras_totals", "model": "resnet50", "mode": "bf16", "roofline": "datasheet", "preset": "x"}
    c = {"table": "layers", "model": "resnet50", "mode": "bf16", "roofline": "datasheet", "v": 2}
    merge_jsonl(path, [a, b])
    merge_jsonl(path, [dict(a, v=3), c])
    assert _read(path) == [c, dict(a, v=3), b]  # layers first, then models in the CLI order (resnet50 first)


def test_cli_records_every_printed_row_and_the_page_shows_them(tmp_path, capsys):
    from experiments.calibration_page import PAGE
    from experiments.page import render_page

    path = str(tmp_path / "cal.jsonl")
    kept = {
        "table": "keras_totals",
        "model": "vgg16",
        "mode": "fp32",
        "roofline": "datasheet",
        "preset": "h200",
    }
    kept.update(est_ms=1.0, meas_nodes_ms=2.0, meas_whole_ms=1.5, keras_layers=23)
    stale = {"table": "layers", "model": "vgg16", "mode": "fp32", "roofline": "datasheet", "stages": 9}
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(stale) + "\n" + json.dumps(kept) + "\n")
    argv = ["--modes", "fp32", "--stages", "2", "--fit-on", "vgg16", "--jsonl", path]  # loo: 6 fits, slow
    assert main(argv) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]

    records = _read(path)
    layers = [r for r in records if r["table"] == "layers"]
    assert records[-1] == kept and len(records) == 2 * len(MODELS) + 1
    assert [r["model"] for r in layers] == [m for m in MODELS for _ in range(2)]
    assert {r["command"] for r in layers} == {"python -m tf_commopt.tf.calibrate " + " ".join(argv)}
    assert all(r["stages"] == 2 and len(r["stage_rel_err"]) == 2 for r in layers)

    meas = load_profile("h200/vgg16.fp32")
    est = estimate_profile(meas, roofline_preset("h200")[0], "fp32")
    sheet = next(r for r in layers if r["model"] == "vgg16" and r["roofline"] == "datasheet")
    le, se = layer_errors(est, meas), stage_errors(est, meas, 2)
    assert sheet["layer_weighted"] == pytest.approx(le["weighted"])
    assert sheet["stage_rel_err"] == pytest.approx(se["rel_err"])

    page = render_page(PAGE, records).splitlines()
    assert printed[2:] and all(row in page for row in printed[2:])  # every row, formatted alike


def test_a_roofline_fitted_on_named_models_says_so():
    from experiments.calibration_page import rows_layers

    common = {
        "table": "layers",
        "mode": "fp32",
        "roofline": "fitted",
        "peak_gflops": 35e3,
        "mem_gbps": 4800.0,
    }
    common.update(overhead_ms=0.08, backward_factor=1.25)
    rows = rows_layers("fp32")(
        [
            dict(common, model="a", fitted_on=["b", "c"]),
            dict(common, model="b", fitted_on=["c"]),
            dict(common, model="c", roofline="datasheet"),
        ]
    )
    assert rows[0]["label"] == "fit: 35 TFLOP/s, 4,800 GB/s, +0.08 ms, bwd 1.25x"
    assert rows[1]["label"] == "fit on c: 35 TFLOP/s, 4,800 GB/s, +0.08 ms, bwd 1.25x"
    assert rows[2]["label"] == "datasheet"


def test_records_docstring_examples():
    import doctest

    from tf_commopt.tf.calibrate import records

    result = doctest.testmod(records)
    assert result.failed == 0 and result.attempted > 0
