"""``python -m tf_commopt.tf.calibrate``: print the calibration tables (markdown) and optionally save the numbers.

For each precision: every model's per-layer and per-stage errors under the datasheet roofline and under
a roofline fitted on the other five models (``--fit-on loo``) or on one model; with ``--keras`` the
tf-keras applications' totals, and with ``--keras-stages`` their 4-stage plans timed on the measurement.
The output is deterministic (pure Python, no timing).

Example:
    >>> main(["--modes", "fp32", "--json", "/tmp/cal.json"])      # doctest: +SKIP
    0
"""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, List, Optional, Tuple

from tf_commopt.tf.calibrate.estimate import MODELS, estimate_profile, layer_errors, stage_errors
from tf_commopt.tf.calibrate.fit import fit_roofline
from tf_commopt.tf.calibrate.keras_apps import keras_application_totals, keras_stage_errors
from tf_commopt.tf.op_costs import Roofline

__all__ = ["main"]

_DATASHEET = {"fp32": "h200", "tf32": "h200-tf32", "bf16": "h200-bf16"}


def _fmt(x: float) -> str:
    return f"{100 * x:+.0f}%"


def _describe(r: Roofline) -> str:
    return (
        f"{r.peak_gflops / 1e3:,.0f} TFLOP/s, {r.mem_gbps:,.0f} GB/s, +{r.overhead_ms} ms, "
        f"bwd {r.backward_factor:g}x"
    )


def _fitted(f: Dict[str, Any]) -> Roofline:
    return Roofline(f["peak_gflops"], f["mem_gbps"], f["backward_factor"], f["overhead_ms"])


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


def _profile_table(mode: str, fit_on: str, stages: int, out: Dict[str, Any]) -> None:
    """Print the per-layer / per-stage table of one precision (numbers also go to ``out``)."""
    from tf_commopt.core.profiles import load_profile
    from tf_commopt.tf.devices import roofline_preset

    sheet = roofline_preset(_DATASHEET[mode])[0]
    print(f"\n## {mode} (fitted: {'leave-one-out over the six models' if fit_on == 'loo' else fit_on})")
    print(
        "| model | roofline | per-layer weighted err | median layer err | total err | "
        f"{stages}-stage errors (est vs meas) | max stage err | share err |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for model in MODELS:
        meas = load_profile(f"h200/{model}.{mode}")
        fitted = _fitted(out[f"fitted.{mode}.{model}"])
        for tag, r in (("datasheet", sheet), ("fitted", fitted)):
            est = estimate_profile(meas, r, mode)
            le, se = layer_errors(est, meas), stage_errors(est, meas, stages)
            out[f"{model}.{mode}.{tag}"] = {"layer": le, "stage": se}
            label = tag if tag == "datasheet" else f"fit: {_describe(r)}"
            print(
                f"| {model} | {label} | {le['weighted']:.0%} | {le['median']:.0%} | {_fmt(le['total'])} | "
                f"{', '.join(_fmt(x) for x in se['rel_err'])} | {se['max_abs_err']:.0%} | {se['share_err']:.1%} |"
            )


def _keras_totals_table(models: List[str], modes: List[str], out: Dict[str, Any]) -> None:
    print(
        "\n| model | mode | preset | Keras layers | estimate ms | measured: sum of layers | "
        "measured: whole model | est / layer sum |\n|---|---|---|---|---|---|---|---|"
    )
    for model in models:
        for r in keras_application_totals(model, modes):
            out[f"keras.{model}.{r['mode']}.{r['preset']}"] = r
            print(
                f"| {model} | {r['mode']} | `{r['preset']}` | {r['keras_layers']} | {r['est_ms']:.1f} | "
                f"{r['meas_nodes_ms']:.1f} | {r['meas_whole_ms']:.1f} | {r['est_ms'] / r['meas_nodes_ms']:.2f} |"
            )


def _keras_stages_table(models: List[str], modes: List[str], stages: int, out: Dict[str, Any]) -> None:
    print(
        f"\n| model | mode | roofline (fitted on the other models) | {stages}-stage errors (Keras est vs "
        "meas) | max stage err |\n|---|---|---|---|---|"
    )
    for model in models:
        for mode in modes:
            r = _fitted(out[f"fitted.{mode}.{model}"])
            ks = keras_stage_errors(model, mode, r, stages)
            out[f"keras_stages.{model}.{mode}"] = ks
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

    parser = _parser()
    try:
        a = parser.parse_args(argv)
    except UsageError as e:
        sys.stderr.write(f"{parser.prog}: error: {e}\n")
        return 2
    quiet_tensorflow(a.tf_log_level)
    modes = a.modes.split(",")
    out: Dict[str, Any] = {}
    for mode in modes:
        _fit_all(mode, a.fit_on, out)
        _profile_table(mode, a.fit_on, a.stages, out)
    if a.keras:
        _keras_totals_table(a.keras.split(","), modes, out)
        if a.keras_stages:
            _keras_stages_table(a.keras.split(","), modes, a.stages, out)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return 0
