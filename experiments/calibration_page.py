"""The page docs/results/calibration.md, rendered from the records ``python -m tf_commopt.tf.calibrate
--jsonl`` writes (one per printed row: :mod:`tf_commopt.tf.calibrate.records`); this module imports none
of the calibration code.

Example:
    python -m tf_commopt.tf.calibrate --jsonl docs/results/calibration.jsonl
    python -m experiments.report calibration
"""

from __future__ import annotations

from typing import Any, Dict, List

from experiments.page import Page, Table

Records = List[Dict[str, Any]]
MODES = ("fp32", "tf32", "bf16")
TABLE_NAMES = {
    "layers": "per layer and per stage",
    "keras_totals": "tf-keras totals",
    "keras_stages": "tf-keras stage plans",
}


def describe(r: Dict[str, Any]) -> str:
    """A roofline record's peak, bandwidth, per-layer overhead and backward factor, as the CLI prints them.

    >>> describe({"peak_gflops": 35000.0, "mem_gbps": 4800.0, "overhead_ms": 0.08, "backward_factor": 1.0})
    '35 TFLOP/s, 4,800 GB/s, +0.08 ms, bwd 1x'
    """
    return (
        f"{r['peak_gflops'] / 1e3:,.0f} TFLOP/s, {r['mem_gbps']:,.0f} GB/s, +{r['overhead_ms']} ms, "
        f"bwd {r['backward_factor']:g}x"
    )


def _of(records: Records, table: str, mode: str = "") -> Records:
    return [r for r in records if r.get("table") == table and (not mode or r.get("mode") == mode)]


def rows_setting(records: Records) -> Records:
    """One row per table and distinct setting: the measurement's device and batch, the plan's stages,
    method and link."""
    keys = ("device", "batch", "stages", "method", "bandwidth_gbps")
    out, seen = [], set()
    for r in records:
        row = {"table": TABLE_NAMES.get(r.get("table"), r.get("table")), **{k: r.get(k) for k in keys}}
        if tuple(row.values()) not in seen:
            seen.add(tuple(row.values()))
            out.append(row)
    return out


def _label(r: Dict[str, Any], models: List[str]) -> str:
    """``datasheet``, ``fit: ...`` (fitted on the other models) or ``fit on <models>: ...``."""
    if r["roofline"] == "datasheet":
        return "datasheet"
    others = [m for m in models if m != r["model"]]
    on = "" if sorted(r.get("fitted_on", [])) == sorted(others) else f" on {', '.join(r['fitted_on'])}"
    return f"fit{on}: {describe(r)}"


def rows_layers(mode: str):
    """The rows of the per-layer / per-stage table of precision ``mode``."""

    def rows(records: Records) -> Records:
        mine = _of(records, "layers", mode)
        models = list(dict.fromkeys(r["model"] for r in mine))
        return [{**r, "label": _label(r, models)} for r in mine]

    return rows


def rows_keras_totals(records: Records) -> Records:
    return [
        {**r, "preset_code": f"`{r['preset']}`", "ratio": r["est_ms"] / r["meas_nodes_ms"]}
        for r in _of(records, "keras_totals")
    ]


def rows_keras_stages(records: Records) -> Records:
    out = []
    for r in _of(records, "keras_stages"):
        models = list(dict.fromkeys(x["model"] for x in _of(records, "layers", r["mode"])))
        out.append({**r, "label": _label(r, models)})
    return out


_LAYER_COLUMNS = [
    ("model", "model", ""),
    ("roofline", "label", ""),
    ("per-layer weighted err", "layer_weighted", ".0%"),
    ("median layer err", "layer_median", ".0%"),
    ("total err", "layer_total", "+.0%"),
    ("stage errors (est vs meas)", "stage_rel_err", "+.0%"),
    ("max stage err", "stage_max_abs_err", ".0%"),
    ("share err", "stage_share_err", ".1%"),
]

PAGE = Page(
    "calibration",
    "Calibration: roofline estimates against the bundled H200 per-layer measurements",
    "The bundled H200 profiles (`tf_commopt/data/profiles/h200`, PyTorch) time every layer of the "
    "torchvision models below alone. `tf_commopt.tf.calibrate` costs **the same nodes** with a roofline "
    "(FLOPs from each layer's label and output size, bytes moved = inputs + outputs + parameters), so "
    "errors are exact node by node, and a plan made on the estimate is timed on the measurement (device, "
    "batch, stages, plan method and link in the setting table). A `datasheet` row uses the H200 datasheet "
    "preset of its precision; a `fit:` row a roofline fitted on the *other* models of its table (leave "
    "one out; `fit on ...` names the models otherwise). Errors: per-layer = sum |est - meas| / sum meas "
    "(fwd+bwd); stage = (est - meas) / meas of each stage; share = largest difference of a stage's share "
    "of the total. The tf-keras tables import each application with TensorFlow "
    "(`from_keras_model(app(weights=None), batch_size=..., roofline=...)` at the input size shown): the "
    "architectures differ in details from torchvision's, the Keras import costs fp32 bytes in bf16 rows, "
    "and the presets `h200-fit` and `h200-bf16-fit` were fitted on all the profiles, so those totals are "
    "in-sample. A stage plan made on a Keras import is carried to the measured graph boundary by boundary, "
    "at the same fraction of cumulative forward FLOPs. Nothing is timed: the numbers are deterministic.",
    [
        Table(
            "Setting",
            rows_setting,
            [
                ("table", "table", ""),
                ("measured on", "device", ""),
                ("batch", "batch", "d"),
                ("stages", "stages", "d"),
                ("plan", "method", ""),
                ("link Gbit/s", "bandwidth_gbps", "g"),
            ],
        ),
        *[Table(f"{mode}: per layer and per stage", rows_layers(mode), _LAYER_COLUMNS) for mode in MODES],
        Table(
            "tf-keras applications against the same measurements",
            rows_keras_totals,
            [
                ("model", "model", ""),
                ("mode", "mode", ""),
                ("preset", "preset_code", ""),
                ("application", "application", ""),
                ("input px", "input_size", "d"),
                ("Keras layers", "keras_layers", "d"),
                ("estimate ms", "est_ms", ".1f"),
                ("measured: sum of layers", "meas_nodes_ms", ".1f"),
                ("measured: whole model", "meas_whole_ms", ".1f"),
                ("est / layer sum", "ratio", ".2f"),
            ],
        ),
        Table(
            "Stage plans made on the tf-keras imports",
            rows_keras_stages,
            [
                ("model", "model", ""),
                ("mode", "mode", ""),
                ("roofline", "label", ""),
                ("stage errors (Keras est vs meas)", "stage_rel_err", "+.0%"),
                ("max stage err", "stage_max_abs_err", ".0%"),
            ],
        ),
    ],
)
