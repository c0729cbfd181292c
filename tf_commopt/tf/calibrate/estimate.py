"""Roofline estimates of the bundled H200 profiles' own nodes, and their errors against the measurement.

The H200 profiles (``tf_commopt/data/profiles/h200``) list every layer of six torchvision models with its
measured forward/backward ms, output bytes and parameter bytes; the label carries the layer's
configuration (``Conv2d(64, 256, kernel_size=(1, 1), stride=(1, 1), bias=False)``). :func:`layer_cost`
reads FLOPs from the label and the output size (2 FLOPs per multiply-add, elementwise layers 1 per
element, pure reshapes free; bytes moved = inputs + outputs + parameters), so
:func:`estimate_profile` costs **the same nodes**: the per-layer error is exact node by node, and a
pipeline plan made on the estimate can be timed on the measurement (:func:`stage_errors`).

Example:
    >>> from tf_commopt.tf.op_costs import Roofline
    >>> est = estimate_profile("h200/resnet50.fp32", Roofline(67000.0, 4800.0))
    >>> from tf_commopt.core.profiles import load_profile
    >>> round(layer_errors(est, load_profile("h200/resnet50.fp32"))["total"], 2)
    -0.67
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from tf_commopt.core.costgraph import CostGraph, Node
from tf_commopt.errors import InputError
from tf_commopt.tf.op_costs import Roofline

__all__ = [
    "MODELS",
    "MODES",
    "DTYPE_BYTES",
    "layer_cost",
    "mode_of",
    "node_costs",
    "estimate_profile",
    "layer_errors",
    "stage_errors",
]

MODELS = ("resnet50", "resnet101", "vgg16", "inception_v3", "densenet121", "mobilenet_v2")
MODES = ("fp32", "tf32", "bf16")
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2}


def _ints(text: str, key: str, default: Tuple[int, ...]) -> Tuple[int, ...]:
    m = re.search(key + r"=\(?([\d, ]+)\)?", text)
    if not m:
        return default
    vals = tuple(int(v) for v in m.group(1).split(",") if v.strip())
    return vals if len(vals) > 1 else vals * len(default)


def _conv_flops(label: str, args: str, out: float) -> float:
    m = re.match(r"^\((\d+), (\d+)", args)
    if m is None:
        raise InputError(f"cannot read a Conv2d label {label!r}")
    cin = int(m.group(1))
    kh, kw = _ints(args, "kernel_size", (1, 1))
    groups = _ints(args, "groups", (1,))[0]
    return 2.0 * out * (cin / groups) * kh * kw + (out if "bias=False" not in args else 0.0)


def layer_cost(
    label: str, out_bytes: float, in_bytes: float, param_bytes: float, n_inputs: int, dtype_bytes: int
) -> Tuple[float, float]:
    """(FLOPs, bytes moved) of one torchvision layer from its label and sizes.

    Args:
        label: the profile's layer label, e.g. ``"Linear(in_features=2048, out_features=1000)"``.
        out_bytes: bytes of its output. in_bytes: bytes of its inputs. param_bytes: its parameters.
        n_inputs: how many inputs (``add`` costs one FLOP per element per extra input).
        dtype_bytes: bytes per element (4 for fp32/tf32, 2 for bf16).

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
        return _conv_flops(label, args, out), moved
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


def mode_of(name: str) -> str:
    """The precision a bundled profile name ends in (``h200/vgg16.bf16`` -> ``bf16``)."""
    for m in MODES:
        if name.endswith("." + m):
            return m
    raise InputError(f"profile name {name!r} must end in .fp32, .tf32 or .bf16", where="calibrate")


def node_costs(measured: CostGraph, mode: str) -> List[Tuple[str, float, float]]:
    """``(node, FLOPs, bytes moved)`` of every node of a measured profile, in topological order."""
    db = DTYPE_BYTES[mode]
    out = []
    for n in measured.topological_order():
        nd = measured[n]
        preds = measured.predecessors(n)
        in_bytes = sum(measured[p].activation_bytes for p in preds)
        flops, moved = layer_cost(
            nd.label or "", nd.activation_bytes, in_bytes, nd.param_bytes, len(preds), db
        )
        out.append((n, flops, moved))
    return out


def estimate_profile(
    measured: "CostGraph | str", roofline: Roofline, mode: Optional[str] = None
) -> CostGraph:
    """The measured profile's graph with roofline times (same node names, edges, bytes).

    Args:
        measured: a profile or a bundled name (``"h200/resnet50.fp32"``, whose suffix gives the mode).
        roofline: the device model.
        mode: ``fp32``, ``tf32`` or ``bf16`` (default: from the name, else fp32).
    """
    from tf_commopt.core.profiles import load_profile

    if isinstance(measured, str):
        mode = mode or mode_of(measured)
        measured = load_profile(measured)
    nodes = []
    for n, flops, moved in node_costs(measured, mode or "fp32"):
        nd = measured[n]
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
