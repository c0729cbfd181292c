"""Hold roofline estimates against the bundled H200 per-layer measurements.

The H200 profiles (``tf_commopt/data/profiles/h200``) list every layer of six torchvision models with
its measured forward/backward ms, output bytes and parameter bytes; the label carries the layer's
configuration (``Conv2d(64, 256, kernel_size=(1, 1), stride=(1, 1), bias=False)``). This module
costs **the same nodes** with a :class:`~tf_commopt.tf.op_costs.Roofline` — FLOPs from the label
and the output size (the rules :mod:`~tf_commopt.tf.op_costs` uses: 2 FLOPs per multiply-add,
elementwise layers 1 per element, pure reshapes free), bytes moved = inputs + outputs + parameters
— so the per-layer error is exact node by node, and a pipeline plan made on the estimate can be
timed on the measurement (per-stage error).

:func:`fit_roofline` fits an effective roofline (peak GFLOP/s, GB/s, a per-layer overhead and the
backward factor) to profiles by a grid search minimising the time-weighted absolute error;
``docs/importing.md`` scores each model with a roofline fitted on the five others (leave one out).
:func:`keras_stage_errors` does the same for the tf-keras applications of the six models: a 4-stage plan
made on ``from_keras_model``'s import, its boundaries carried to the measured graph by cumulative FLOPs.

Example:
    >>> from tf_commopt.tf.calibrate import estimate_profile, layer_errors      # doctest: +SKIP
    >>> from tf_commopt.tf.devices import roofline_preset                        # doctest: +SKIP
    >>> est = estimate_profile("h200/resnet50.fp32", roofline_preset("h200")[0]) # doctest: +SKIP
    >>> layer_errors(est, load_profile("h200/resnet50.fp32"))["weighted"]        # doctest: +SKIP

Command line (prints the tables of ``docs/importing.md``)::

    python -m tf_commopt.tf.calibrate                      # leave-one-out fits, 4 stages, fp32 and bf16
    TF_USE_LEGACY_KERAS=1 python -m tf_commopt.tf.calibrate --keras resnet50,vgg16   # + tf-keras imports
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tf_commopt.core.costgraph import CostGraph, Node
from tf_commopt.errors import InputError
from tf_commopt.tf.op_costs import Roofline

__all__ = [
    "layer_cost",
    "estimate_profile",
    "layer_errors",
    "stage_errors",
    "fit_roofline",
    "keras_application_totals",
    "keras_stage_errors",
    "MODELS",
    "MODES",
    "KERAS_APPS",
]

MODELS = ("resnet50", "resnet101", "vgg16", "inception_v3", "densenet121", "mobilenet_v2")
MODES = ("fp32", "tf32", "bf16")
_DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2}


def _ints(text: str, key: str, default: Tuple[int, ...]) -> Tuple[int, ...]:
    m = re.search(key + r"=\(?([\d, ]+)\)?", text)
    if not m:
        return default
    vals = tuple(int(v) for v in m.group(1).split(",") if v.strip())
    return vals if len(vals) > 1 else vals * len(default)


def layer_cost(
    label: str, out_bytes: float, in_bytes: float, param_bytes: float, n_inputs: int, dtype_bytes: int
) -> Tuple[float, float]:
    """(FLOPs, bytes moved) of one torchvision layer from its label and sizes.

    Example:
        >>> layer_cost("Conv2d(64, 256, kernel_size=(1, 1), stride=(1, 1), bias=False)", 4 * 32 * 256 * 56 * 56,
        ...            4 * 32 * 64 * 56 * 56, 4 * 64 * 256, 1, 4)[0] == 2 * 32 * 56 * 56 * 256 * 64
        True
    """
    out = out_bytes / dtype_bytes
    kind = label.split("(")[0].strip()
    moved = in_bytes + out_bytes + param_bytes
    args = label[len(kind) :]
    if kind == "Conv2d":
        nums = (
            [int(v) for v in re.findall(r"^\((\d+), (\d+)", args)[0]]
            if re.match(r"^\(\d+, \d+", args)
            else None
        )
        if nums is None:
            raise InputError(f"cannot read a Conv2d label {label!r}")
        cin = nums[0]
        kh, kw = _ints(args, "kernel_size", (1, 1))
        groups = _ints(args, "groups", (1,))[0]
        flops = 2.0 * out * (cin / groups) * kh * kw + (out if "bias=False" not in args else 0.0)
        return flops, moved
    if kind == "Linear":
        fin = int(re.search(r"in_features=(\d+)", args).group(1))
        return 2.0 * out * fin + (out if "bias=False" not in args else 0.0), moved
    if kind in ("flatten", "Dropout"):  # reshape / identity at eval cost: move nothing
        return 0.0, 0.0
    if kind in ("MaxPool2d", "AvgPool2d", "max_pool2d", "avg_pool2d"):
        k = _ints(args, "kernel_size", (3, 3))
        return out * k[0] * k[-1], moved
    if kind in ("AdaptiveAvgPool2d", "adaptive_avg_pool2d"):
        return in_bytes / dtype_bytes, moved
    if kind == "add":
        return out * max(n_inputs - 1, 1), moved
    if kind == "cat":
        return 0.0, moved
    return out, moved  # BatchNorm, ReLU, ReLU6: ~1 FLOP per element, memory-bound


def _mode_of(name: str) -> str:
    for m in MODES:
        if name.endswith("." + m):
            return m
    raise InputError(f"profile name {name!r} must end in .fp32, .tf32 or .bf16", where="calibrate")


def estimate_profile(
    measured: "CostGraph | str", roofline: Roofline, mode: Optional[str] = None
) -> CostGraph:
    """The measured profile's graph with roofline times (same node names, edges, bytes)."""
    from tf_commopt.core.profiles import load_profile

    if isinstance(measured, str):
        mode = mode or _mode_of(measured)
        measured = load_profile(measured)
    db = _DTYPE_BYTES[mode or "fp32"]
    nodes = []
    for n in measured.topological_order():
        nd = measured[n]
        preds = measured.predecessors(n)
        in_bytes = sum(measured[p].activation_bytes for p in preds)
        flops, moved = layer_cost(
            nd.label or "", nd.activation_bytes, in_bytes, nd.param_bytes, len(preds), db
        )
        fwd = roofline.forward_ms(flops, moved)
        nodes.append(Node(n, fwd, roofline.backward_ms(fwd), nd.param_bytes, nd.activation_bytes, nd.label))
    return CostGraph(nodes, list(measured.edges), name=f"{measured.name} (roofline)")


def layer_errors(est: CostGraph, meas: CostGraph) -> Dict[str, float]:
    """Per-layer error of fwd+bwd times: ``weighted`` = sum |est - meas| / sum meas, ``median`` relative
    error over layers, ``total`` = (sum est - sum meas) / sum meas."""
    e = np.array([est.compute_ms(n) for n in meas.nodes])
    m = np.array([meas.compute_ms(n) for n in meas.nodes])
    keep = m > 0
    rel = np.abs(e[keep] - m[keep]) / m[keep]
    return {
        "weighted": float(np.abs(e - m).sum() / m.sum()),
        "median": float(np.median(rel)),
        "total": float((e.sum() - m.sum()) / m.sum()),
    }


def stage_errors(
    est: CostGraph, meas: CostGraph, stages: int = 4, method: str = "balanced", bandwidth_gbps: float = 100.0
) -> Dict[str, Any]:
    """Plan ``stages`` stages on the estimate (as a user would), time the same stages on the measurement.

    Returns ``{"est_ms": [...], "meas_ms": [...], "rel_err": [...], "max_abs_err", "bottleneck_err",
    "share_err"}`` — ``share_err`` compares each stage's share of the total (what balance depends on).
    """
    from tf_commopt.core.partition.api import evaluate, partition

    plan = partition(est, stages, method=method, bandwidth_gbps=bandwidth_gbps)
    on_meas = evaluate(meas, plan.stage_of_node, bandwidth_gbps=bandwidth_gbps)
    e, m = list(plan.stage_compute_ms), list(on_meas.stage_compute_ms)
    rel = [(a - b) / b if b > 0 else float("inf") for a, b in zip(e, m)]
    se, sm = sum(e), sum(m)
    share = [a / se - b / sm for a, b in zip(e, m)]
    return {
        "est_ms": e,
        "meas_ms": m,
        "rel_err": rel,
        "max_abs_err": max(abs(r) for r in rel),
        "bottleneck_err": (max(e) - max(m)) / max(m),
        "share_err": max(abs(s) for s in share),
    }


def _features(meas: CostGraph, mode: str) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    db = _DTYPE_BYTES[mode]
    F, M, T = [], [], []
    for n in meas.topological_order():
        nd = meas[n]
        preds = meas.predecessors(n)
        f, b = layer_cost(
            nd.label or "",
            nd.activation_bytes,
            sum(meas[p].activation_bytes for p in preds),
            nd.param_bytes,
            len(preds),
            db,
        )
        F.append(f)
        M.append(b)
        T.append(meas.compute_ms(n))
    return np.array(F), np.array(M), np.array(T)


def fit_roofline(profiles: Sequence[str]) -> Tuple[Roofline, float]:
    """Effective ``Roofline`` (peak, bandwidth, per-layer overhead, backward factor) minimising the
    time-weighted absolute per-layer error over ``profiles`` (grid search); returns it and the error."""
    from tf_commopt.core.profiles import load_profile

    feats = [_features(load_profile(p), _mode_of(p)) for p in profiles]
    F = np.concatenate([f[0] for f in feats])
    M = np.concatenate([f[1] for f in feats])
    T = np.concatenate([f[2] for f in feats])
    best = (float("inf"), None)
    peaks = np.geomspace(2e3, 1e6, 40)  # GFLOP/s
    bws = np.geomspace(200.0, 4800.0, 40)  # GB/s, at most the datasheet
    for o in (0.0, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1):
        for beta in np.arange(1.0, 3.01, 0.25):
            for p in peaks:
                comp = F / (p * 1e9) * 1e3
                t_all = np.maximum(comp[None, :], (M[None, :] / (bws[:, None] * 1e9) * 1e3))
                est = (1 + beta) * (t_all + o)
                err = np.abs(est - T[None, :]).sum(axis=1) / T.sum()
                k = int(np.argmin(err))
                if err[k] < best[0]:
                    best = (float(err[k]), Roofline(float(p), float(bws[k]), float(beta), float(o)))
    return best[1], best[0]


#: tf-keras application and input size of each profiled torchvision model
KERAS_APPS = {
    "resnet50": ("ResNet50", 224),
    "resnet101": ("ResNet101", 224),
    "vgg16": ("VGG16", 224),
    "inception_v3": ("InceptionV3", 299),
    "densenet121": ("DenseNet121", 224),
    "mobilenet_v2": ("MobileNetV2", 224),
}


def keras_application_totals(model: str, modes: Sequence[str] = ("fp32", "bf16")) -> List[Dict[str, Any]]:
    """The tf-keras application of ``model`` (weights=None, batch 32) imported with ``from_keras_model`` under
    the datasheet and fitted H200 presets, next to the measured totals (imports TensorFlow and tf-keras)."""
    import json as _json
    import os

    import tf_keras as keras

    from tf_commopt.core.profiles import bundled_profile_path, load_profile
    from tf_commopt.tf.devices import roofline_preset
    from tf_commopt.tf.graph_import import from_keras_model

    app, size = KERAS_APPS[model]
    m = getattr(keras.applications, app)(weights=None, input_shape=(size, size, 3))
    rows = []
    for mode in modes:
        meas = load_profile(f"h200/{model}.{mode}")
        meta_path = os.path.join(
            os.path.dirname(bundled_profile_path(f"h200/{model}.{mode}")), f"{model}.{mode}.b32.meta.json"
        )
        with open(meta_path, encoding="utf-8") as f:
            whole = _json.load(f)["whole_fwd_bwd_ms"]
        sheet = {"fp32": "h200", "tf32": "h200-tf32", "bf16": "h200-bf16"}[mode]
        for preset in (sheet, "h200-fit" if mode != "bf16" else "h200-bf16-fit"):
            g = from_keras_model(m, batch_size=32, roofline=roofline_preset(preset)[0])
            rows.append(
                {
                    "model": model,
                    "mode": mode,
                    "preset": preset,
                    "keras_layers": len(g),
                    "est_ms": g.total_ms(),
                    "meas_nodes_ms": meas.total_ms(),
                    "meas_whole_ms": whole,
                }
            )
    return rows


def keras_stage_errors(
    model: str, mode: str, roofline: Roofline, stages: int = 4, bandwidth_gbps: float = 100.0
) -> Dict[str, Any]:
    """Plan ``stages`` stages on the tf-keras application's import and time them on the measured profile.

    Keras and torchvision layers do not correspond one to one, so each stage boundary is carried over
    by **cumulative forward FLOPs**: a Keras stage ending at fraction ``f`` of the model's FLOPs (in
    topological order) ends, in the measured graph, at the first node where the cumulative FLOPs reach
    ``f``. Returns the stage times of both and their relative errors (imports TensorFlow).
    """
    import tf_keras as keras

    from tf_commopt.core.partition.api import evaluate, partition
    from tf_commopt.core.profiles import load_profile
    from tf_commopt.tf.graph_import import from_keras_model

    app, size = KERAS_APPS[model]
    m = keras.applications.__dict__[app](weights=None, input_shape=(size, size, 3))
    est = from_keras_model(m, batch_size=32, roofline=roofline)
    kflops = from_keras_model(m, batch_size=32, roofline=Roofline(peak_gflops=1.0, mem_gbps=1e15))
    plan = partition(est, stages, method="balanced", bandwidth_gbps=bandwidth_gbps)
    order = est.topological_order()
    total = sum(kflops[n].forward_ms for n in order)
    ends, acc = [], 0.0
    for i, n in enumerate(order):
        acc += kflops[n].forward_ms
        if i + 1 < len(order) and plan.stage_of_node[order[i + 1]] != plan.stage_of_node[n]:
            ends.append(acc / total)
    meas = load_profile(f"h200/{model}.{mode}")
    F, _, _ = _features(meas, mode)
    morder = meas.topological_order()
    cum = np.cumsum(F) / F.sum()
    stage_of, s = {}, 0
    for i, n in enumerate(morder):
        stage_of[n] = s
        while s < len(ends) and cum[i] >= ends[s] - 1e-12 and i + 1 < len(morder):
            s += 1
    on_meas = evaluate(meas, stage_of, bandwidth_gbps=bandwidth_gbps)
    e, mm = list(plan.stage_compute_ms), list(on_meas.stage_compute_ms)
    rel = [(a - b) / b for a, b in zip(e, mm)]
    return {
        "model": model,
        "mode": mode,
        "est_ms": e,
        "meas_ms": mm,
        "rel_err": rel,
        "max_abs_err": max(abs(r) for r in rel),
        "flop_fractions": ends,
    }


def _fmt(x: float) -> str:
    return f"{100 * x:+.0f}%"


def main(argv: Optional[List[str]] = None) -> int:
    """Print per-layer and per-stage errors of the presets and of a roofline fitted on one model."""
    from tf_commopt._cli import CliParser, add_tf_log_level, quiet_tensorflow

    ap = CliParser(prog="python -m tf_commopt.tf.calibrate", description=main.__doc__)
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
    a = ap.parse_args(argv)
    quiet_tensorflow(a.tf_log_level)
    from tf_commopt.core.profiles import load_profile
    from tf_commopt.tf.devices import roofline_preset

    out: Dict[str, Any] = {}
    for mode in a.modes.split(","):
        sheet = roofline_preset(
            "h200-bf16" if mode == "bf16" else ("h200-tf32" if mode == "tf32" else "h200")
        )[0]
        fits: Dict[str, Tuple[Roofline, float]] = {}
        for model in MODELS:
            train = [m for m in MODELS if m != model] if a.fit_on == "loo" else [a.fit_on]
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
        print(
            f"\n## {mode} (fitted: {'leave-one-out over the six models' if a.fit_on == 'loo' else a.fit_on})"
        )
        print(
            "| model | roofline | per-layer weighted err | median layer err | total err | "
            f"{a.stages}-stage errors (est vs meas) | max stage err | share err |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for model in MODELS:
            name = f"h200/{model}.{mode}"
            meas = load_profile(name)
            f = out[f"fitted.{mode}.{model}"]
            fitted = Roofline(f["peak_gflops"], f["mem_gbps"], f["backward_factor"], f["overhead_ms"])
            for tag, r in (("datasheet", sheet), ("fitted", fitted)):
                est = estimate_profile(meas, r, mode)
                le = layer_errors(est, meas)
                se = stage_errors(est, meas, a.stages)
                out[f"{model}.{mode}.{tag}"] = {"layer": le, "stage": se}
                label = (
                    tag
                    if tag == "datasheet"
                    else (
                        f"fit: {r.peak_gflops / 1e3:,.0f} TFLOP/s, {r.mem_gbps:,.0f} GB/s, "
                        f"+{r.overhead_ms} ms, bwd {r.backward_factor:g}x"
                    )
                )
                print(
                    f"| {model} | {label} | {le['weighted']:.0%} | {le['median']:.0%} | {_fmt(le['total'])} | "
                    f"{', '.join(_fmt(x) for x in se['rel_err'])} | {se['max_abs_err']:.0%} | {se['share_err']:.1%} |"
                )
    if a.keras:
        print(
            "\n| model | mode | preset | Keras layers | estimate ms | measured: sum of layers | "
            "measured: whole model | est / layer sum |\n|---|---|---|---|---|---|---|---|"
        )
        for model in a.keras.split(","):
            for r in keras_application_totals(model, a.modes.split(",")):
                out[f"keras.{model}.{r['mode']}.{r['preset']}"] = r
                print(
                    f"| {model} | {r['mode']} | `{r['preset']}` | {r['keras_layers']} | {r['est_ms']:.1f} | "
                    f"{r['meas_nodes_ms']:.1f} | {r['meas_whole_ms']:.1f} | {r['est_ms'] / r['meas_nodes_ms']:.2f} |"
                )
        if a.keras_stages:
            print(
                f"\n| model | mode | roofline (fitted on the other models) | {a.stages}-stage errors (Keras est vs "
                "meas) | max stage err |\n|---|---|---|---|---|"
            )
            for model in a.keras.split(","):
                for mode in a.modes.split(","):
                    f = out.get(f"fitted.{mode}.{model}")
                    r = Roofline(f["peak_gflops"], f["mem_gbps"], f["backward_factor"], f["overhead_ms"])
                    ks = keras_stage_errors(model, mode, r, a.stages)
                    out[f"keras_stages.{model}.{mode}"] = ks
                    print(
                        f"| {model} | {mode} | {r.peak_gflops / 1e3:,.0f} TFLOP/s, {r.mem_gbps:,.0f} GB/s, "
                        f"+{r.overhead_ms} ms, bwd {r.backward_factor:g}x | "
                        f"{', '.join(_fmt(x) for x in ks['rel_err'])} | {ks['max_abs_err']:.0%} |",
                        flush=True,
                    )
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
