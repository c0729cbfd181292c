"""The tf-keras applications of the six profiled models, imported and held against the H200 measurements.

:func:`keras_application_totals` compares the totals of ``from_keras_model`` imports with the measured
ones; :func:`keras_stage_errors` plans stages on a Keras import and times them on the measured profile.
Keras and torchvision layers do not correspond one to one, so a stage boundary is carried over by
**cumulative forward FLOPs**. Both import TensorFlow and tf-keras.

Example:
    >>> from tf_commopt.tf.devices import roofline_preset                              # doctest: +SKIP
    >>> keras_stage_errors("resnet50", "fp32", roofline_preset("h200-fit")[0])["max_abs_err"]  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

import numpy as np

from tf_commopt.tf.calibrate.fit import features
from tf_commopt.tf.calibrate.records import profile_meta
from tf_commopt.tf.op_costs import Roofline

__all__ = ["KERAS_APPS", "BATCH", "keras_application_totals", "keras_stage_errors"]

#: tf-keras application and input size of each profiled torchvision model
KERAS_APPS = {
    "resnet50": ("ResNet50", 224),
    "resnet101": ("ResNet101", 224),
    "vgg16": ("VGG16", 224),
    "inception_v3": ("InceptionV3", 299),
    "densenet121": ("DenseNet121", 224),
    "mobilenet_v2": ("MobileNetV2", 224),
}
BATCH = 32  # the batch of the bundled H200 measurements
_DATASHEET = {"fp32": "h200", "tf32": "h200-tf32", "bf16": "h200-bf16"}


def _application(model: str) -> Any:
    import tf_keras as keras

    app, size = KERAS_APPS[model]
    return getattr(keras.applications, app)(weights=None, input_shape=(size, size, 3))


def keras_application_totals(model: str, modes: Sequence[str] = ("fp32", "bf16")) -> List[Dict[str, Any]]:
    """The tf-keras application of ``model`` (weights=None, batch 32) imported with ``from_keras_model``
    under the datasheet and fitted H200 presets, next to the measured totals.

    Args:
        model: one of :data:`KERAS_APPS`. modes: precisions (``fp32``, ``tf32``, ``bf16``).
    """
    from tf_commopt.core.profiles import load_profile
    from tf_commopt.tf.devices import roofline_preset
    from tf_commopt.tf.graph_import import from_keras_model

    m = _application(model)
    rows = []
    for mode in modes:
        meas = load_profile(f"h200/{model}.{mode}")
        whole = profile_meta(model, mode)["whole_fwd_bwd_ms"]
        for preset in (_DATASHEET[mode], "h200-fit" if mode != "bf16" else "h200-bf16-fit"):
            g = from_keras_model(m, batch_size=BATCH, roofline=roofline_preset(preset)[0])
            rows.append(
                {
                    "model": model,
                    "mode": mode,
                    "preset": preset,
                    "application": KERAS_APPS[model][0],
                    "input_size": KERAS_APPS[model][1],
                    "batch": BATCH,
                    "keras_layers": len(g),
                    "est_ms": g.total_ms(),
                    "meas_nodes_ms": meas.total_ms(),
                    "meas_whole_ms": whole,
                }
            )
    return rows


def _flop_fractions(est, kflops, stage_of_node) -> List[float]:
    """The fraction of the model's forward FLOPs (topological order) at which each stage ends."""
    order = est.topological_order()
    total = sum(kflops[n].forward_ms for n in order)
    ends, acc = [], 0.0
    for i, n in enumerate(order):
        acc += kflops[n].forward_ms
        if i + 1 < len(order) and stage_of_node[order[i + 1]] != stage_of_node[n]:
            ends.append(acc / total)
    return ends


def _stages_at_fractions(meas, mode: str, ends: List[float]) -> Dict[str, int]:
    """Stage of every measured node: a stage ends at the first node whose cumulative FLOPs reach its end."""
    F, _, _ = features(meas, mode)
    order = meas.topological_order()
    cum = np.cumsum(F) / F.sum()
    stage_of, s = {}, 0
    for i, n in enumerate(order):
        stage_of[n] = s
        while s < len(ends) and cum[i] >= ends[s] - 1e-12 and i + 1 < len(order):
            s += 1
    return stage_of


def keras_stage_errors(
    model: str, mode: str, roofline: Roofline, stages: int = 4, bandwidth_gbps: float = 100.0
) -> Dict[str, Any]:
    """Plan ``stages`` stages on the tf-keras application's import and time them on the measured profile.

    A Keras stage ending at fraction ``f`` of the model's forward FLOPs (topological order) ends, in the
    measured graph, at the first node where the cumulative FLOPs reach ``f``.

    Args:
        model: one of :data:`KERAS_APPS`. mode: the measured precision. roofline: the estimate's device.
        stages: pipeline stages. bandwidth_gbps: link bandwidth of the plan.

    Returns:
        The stage times of both (``est_ms``, ``meas_ms``), their relative errors and the FLOP fractions.
    """
    from tf_commopt.core.partition.api import evaluate, partition
    from tf_commopt.core.profiles import load_profile
    from tf_commopt.tf.graph_import import from_keras_model

    m = _application(model)
    est = from_keras_model(m, batch_size=BATCH, roofline=roofline)
    kflops = from_keras_model(m, batch_size=BATCH, roofline=Roofline(peak_gflops=1.0, mem_gbps=1e15))
    plan = partition(est, stages, method="balanced", bandwidth_gbps=bandwidth_gbps)
    ends = _flop_fractions(est, kflops, plan.stage_of_node)
    meas = load_profile(f"h200/{model}.{mode}")
    on_meas = evaluate(meas, _stages_at_fractions(meas, mode, ends), bandwidth_gbps=bandwidth_gbps)
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
