"""``python -m tf_commopt.tf.calibrate``: print the calibration tables (markdown) and optionally save the numbers.

For each precision: every model's per-layer and per-stage errors under the datasheet roofline and under
a roofline fitted on the other five models (``--fit-on loo``) or on one model; with ``--keras`` the
tf-keras applications' totals, and with ``--keras-stages`` their 4-stage plans timed on the measurement.
The output is deterministic (pure Python, no timing). ``--json`` saves every number in one object;
``--jsonl`` saves one record per printed row (:mod:`~tf_commopt.tf.calibrate.records`), from which
``python -m experiments.report calibration`` renders docs/results/calibration.md.

Example:
    >>> main(["--modes", "fp32", "--jsonl", "/tmp/cal.jsonl"])      # doctest: +SKIP
    0
"""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, List, Optional, Tuple

from tf_commopt.tf.calibrate.estimate import MODELS, estimate_profile, layer_errors, stage_errors
from tf_commopt.tf.calibrate.fit import fit_roofline
from tf_commopt.tf.calibrate.keras_apps import keras_application_totals, keras_stage_errors
from tf_commopt.tf.calibrate.records import command_line, merge_jsonl, profile_meta
from tf_commopt.tf.op_costs import Roofline

__all__ = ["main", "METHOD", "BANDWIDTH_GBPS"]

_DATASHEET = {"fp32": "h200", "tf32": "h200-tf32", "bf16": "h200-bf16"}
METHOD = "balanced"  # how the stages are planned on the estimate
BANDWIDTH_GBPS = 100.0  # the link between stages of that plan
Record = Dict[str, Any]


def _fmt(x: float) -> str:
    return f"{100 * x:+.0f}%"


def _describe(r: Roofline) -> str:
    return (
        f"{r.peak_gflops / 1e3:,.0f} TFLOP/s, {r.mem_gbps:,.0f} GB/s, +{r.overhead_ms} ms, "
        f"bwd {r.backward_factor:g}x"
    )


def _fitted(f: Dict[str, Any]) -> Roofline:
    return Roofline(f["peak_gflops"], f["mem_gbps"], f["backward_factor"], f["overhead_ms"])


def _roofline_fields(r: Roofline) -> Record:
    return {
        "peak_gflops": r.peak_gflops,
        "mem_gbps": r.mem_gbps,
        "overhead_ms": r.overhead_ms,
        "backward_factor": r.backward_factor,
    }


def _parser():
    from tf_commopt._cli import CliParser, add_tf_log_level

    ap = CliParser(
        raise_usage_errors=True,
        prog="python -m tf_commopt.tf.calibrate",
        description="Print per-layer and per-stage errors of the presets and of a roofline fitted on one model.",
    )
    ap.add_argument(
        "--fit-on",
        default="loo",
        help="model whose profile the roofline is fitted to, or 'loo': each model is scored with a "
        "roofline fitted on the five others (leave one out)",
    )
    ap.add_argument("--stages", type=int, default=4, help="stages of the per-stage errors")
    ap.add_argument("--modes", default="fp32,bf16", help="comma-separated precisions (fp32, bf16, tf32)")
    ap.add_argument("--json", default=None, help="also write all numbers here")
    ap.add_argument(
        "--jsonl",
        default=None,
        help="also write one record per printed row here, replacing the rows of the same table, model, "
        "precision and roofline already in the file (docs/results/calibration.jsonl feeds "
        "python -m experiments.report calibration)",
    )
    ap.add_argument(
        "--keras-stages",
        action="store_true",
        help="with --keras: also plan on each Keras import and time the stages on the measurement",
    )
    ap.add_argument(
        "--keras",
        default=None,
        help="comma-separated models: also import their tf-keras applications (needs TensorFlow)",
    )
    add_tf_log_level(ap)
    return ap


def _fit_all(mode: str, fit_on: str, out: Dict[str, Any]) -> None:
    """Fit the roofline each model is scored with (``fitted.<mode>.<model>`` in ``out``)."""
    fits: Dict[str, Tuple[Roofline, float]] = {}
    for model in MODELS:
        train = [m for m in MODELS if m != model] if fit_on == "loo" else [fit_on]
        key = ",".join(train)
        if key not in fits:
            fits[key] = fit_roofline([f"h200/{m}.{mode}" for m in train])
        fitted, ferr = fits[key]
        out[f"fitted.{mode}.{model}"] = {
            "fitted_on": train,
            "peak_gflops": fitted.peak_gflops,
            "mem_gbps": fitted.mem_gbps,
            "overhead_ms": fitted.overhead_ms,
            "backward_factor": fitted.backward_factor,
            "fit_error": ferr,
        }


def _layer_record(
    model: str, mode: str, tag: str, r: Roofline, le: Record, se: Record, out: Record
) -> Record:
    """The record of one row of the per-layer / per-stage table."""
    meta = profile_meta(model, mode)
    rec: Record = {"table": "layers", "model": model, "mode": mode, "roofline": tag}
    if tag == "datasheet":
        rec["preset"] = _DATASHEET[mode]
    else:
        fit = out[f"fitted.{mode}.{model}"]
        rec.update(fitted_on=fit["fitted_on"], fit_error=fit["fit_error"])
    rec.update(_roofline_fields(r))
    rec.update(profile=f"h200/{model}.{mode}", batch=meta["batch"], device=meta["device"])
    rec.update(stages=len(se["est_ms"]), method=METHOD, bandwidth_gbps=BANDWIDTH_GBPS)
    rec.update({f"layer_{k}": v for k, v in le.items()})
    rec.update({f"stage_{k}": v for k, v in se.items()})
    return rec


def _profile_table(mode: str, fit_on: str, stages: int, out: Dict[str, Any], rows: List[Record]) -> None:
    """Print the per-layer / per-stage table of one precision (numbers also go to ``out`` and ``rows``)."""
    from tf_commopt.core.profiles import load_profile
    from tf_commopt.tf.devices import roofline_preset

    sheet = roofline_preset(_DATASHEET[mode])[0]
    print(f"\n## {mode} (fitted: {'leave-one-out over the six models' if fit_on == 'loo' else fit_on})")
    print(
        "| model | roofline | per-layer weighted err | median layer err | total err | "
        f"{stages}-stage errors (est vs meas) | max stage err | share err |"
    )
    print("|---|---|---|---|---|---|---|---|")
    on = "" if fit_on == "loo" else f" on {fit_on}"  # as the page labels a roofline fitted on named models
    for model in MODELS:
        meas = load_profile(f"h200/{model}.{mode}")
        fitted = _fitted(out[f"fitted.{mode}.{model}"])
        for tag, r in (("datasheet", sheet), ("fitted", fitted)):
            est = estimate_profile(meas, r, mode)
            le = layer_errors(est, meas)
            se = stage_errors(est, meas, stages, method=METHOD, bandwidth_gbps=BANDWIDTH_GBPS)
            out[f"{model}.{mode}.{tag}"] = {"layer": le, "stage": se}
            rows.append(_layer_record(model, mode, tag, r, le, se, out))
            label = tag if tag == "datasheet" else f"fit{on}: {_describe(r)}"
            print(
                f"| {model} | {label} | {le['weighted']:.0%} | {le['median']:.0%} | {_fmt(le['total'])} | "
                f"{', '.join(_fmt(x) for x in se['rel_err'])} | {se['max_abs_err']:.0%} | {se['share_err']:.1%} |"
            )


def _keras_totals_table(models: List[str], modes: List[str], out: Dict[str, Any], rows: List[Record]) -> None:
    print(
        "\n| model | mode | preset | Keras layers | estimate ms | measured: sum of layers | "
        "measured: whole model | est / layer sum |\n|---|---|---|---|---|---|---|---|"
    )
    for model in models:
        for r in keras_application_totals(model, modes):
            out[f"keras.{model}.{r['mode']}.{r['preset']}"] = r
            tag = "datasheet" if r["preset"] == _DATASHEET[r["mode"]] else "fitted"
            device = profile_meta(model, r["mode"])["device"]
            rows.append({"table": "keras_totals", "roofline": tag, **r, "device": device})
            print(
                f"| {model} | {r['mode']} | `{r['preset']}` | {r['keras_layers']} | {r['est_ms']:.1f} | "
                f"{r['meas_nodes_ms']:.1f} | {r['meas_whole_ms']:.1f} | {r['est_ms'] / r['meas_nodes_ms']:.2f} |"
            )


def _keras_stages_table(
    models: List[str], modes: List[str], stages: int, out: Dict[str, Any], rows: List[Record]
) -> None:
    print(
        f"\n| model | mode | roofline (fitted on the other models) | {stages}-stage errors (Keras est vs "
        "meas) | max stage err |\n|---|---|---|---|---|"
    )
    for model in models:
        for mode in modes:
            fit = out[f"fitted.{mode}.{model}"]
            r = _fitted(fit)
            ks = keras_stage_errors(model, mode, r, stages, bandwidth_gbps=BANDWIDTH_GBPS)
            out[f"keras_stages.{model}.{mode}"] = ks
            rec: Record = {"table": "keras_stages", "model": model, "mode": mode, "roofline": "fitted"}
            rec.update(fitted_on=fit["fitted_on"], fit_error=fit["fit_error"], **_roofline_fields(r))
            meta = profile_meta(model, mode)
            rec.update(profile=f"h200/{model}.{mode}", batch=meta["batch"], device=meta["device"])
            rec.update(stages=stages, method=METHOD, bandwidth_gbps=BANDWIDTH_GBPS)
            rec.update(
                {k if k == "flop_fractions" else f"stage_{k}": v for k, v in ks.items() if k not in rec}
            )
            rows.append(rec)
            print(
                f"| {model} | {mode} | {_describe(r)} | "
                f"{', '.join(_fmt(x) for x in ks['rel_err'])} | {ks['max_abs_err']:.0%} |",
                flush=True,
            )


def main(argv: Optional[List[str]] = None) -> int:
    """Print per-layer and per-stage errors of the presets and of a roofline fitted on one model.

    Args:
        argv: the command line (default: ``sys.argv[1:]``).

    Returns:
        0, or 2 for a bad flag (one line on stderr).
    """
    from tf_commopt._cli import UsageError, quiet_tensorflow

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    try:
        a = parser.parse_args(argv)
    except UsageError as e:
        sys.stderr.write(f"{parser.prog}: error: {e}\n")
        return 2
    quiet_tensorflow(a.tf_log_level)
    if a.keras:
        from tf_commopt import use_tf_keras

        use_tf_keras()  # the applications are tf-keras models
    modes = a.modes.split(",")
    out: Dict[str, Any] = {}
    rows: List[Record] = []
    for mode in modes:
        _fit_all(mode, a.fit_on, out)
        _profile_table(mode, a.fit_on, a.stages, out, rows)
    if a.keras:
        _keras_totals_table(a.keras.split(","), modes, out, rows)
        if a.keras_stages:
            _keras_stages_table(a.keras.split(","), modes, a.stages, out, rows)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    if a.jsonl:
        command = command_line(argv)
        merge_jsonl(a.jsonl, [{**r, "command": command} for r in rows])
    return 0
