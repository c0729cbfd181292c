"""Fit an effective roofline to measured profiles: peak, bandwidth, per-layer overhead, backward factor.

:func:`fit_roofline` grid-searches the four numbers that minimise the time-weighted absolute per-layer
error over the given bundled profiles (bandwidth at most the H200 datasheet's 4,800 GB/s). Scoring a
model with a roofline fitted on the *other* models (leave one out) is how ``python -m
tf_commopt.tf.calibrate`` reports errors.

Example:
    >>> r, err = fit_roofline(["h200/resnet50.fp32"])       # doctest: +SKIP
    >>> round(r.overhead_ms, 2), err < 0.3                   # doctest: +SKIP
    (0.08, True)
"""

from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np

from tf_commopt.core.costgraph import CostGraph
from tf_commopt.tf.calibrate.estimate import mode_of, node_costs
from tf_commopt.tf.op_costs import Roofline

__all__ = ["features", "fit_roofline", "PEAKS_GFLOPS", "BANDWIDTHS_GBPS", "OVERHEADS_MS", "BACKWARD_FACTORS"]

PEAKS_GFLOPS = np.geomspace(2e3, 1e6, 40)
BANDWIDTHS_GBPS = np.geomspace(200.0, 4800.0, 40)  # at most the datasheet
OVERHEADS_MS = (0.0, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1)
BACKWARD_FACTORS = np.arange(1.0, 3.01, 0.25)


def features(meas: CostGraph, mode: str) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(FLOPs, bytes moved, measured fwd+bwd ms) of every node of a profile, in topological order."""
    rows = node_costs(meas, mode)
    flops = np.array([f for _, f, _ in rows])
    moved = np.array([b for _, _, b in rows])
    times = np.array([meas.compute_ms(n) for n, _, _ in rows])
    return flops, moved, times


def fit_roofline(profiles: Sequence[str]) -> Tuple[Roofline, float]:
    """The ``Roofline`` minimising the time-weighted absolute per-layer error over ``profiles``, and that error.

    Args:
        profiles: bundled profile names with their precision, e.g. ``["h200/vgg16.fp32"]``.
    """
    from tf_commopt.core.profiles import load_profile

    feats = [features(load_profile(p), mode_of(p)) for p in profiles]
    F = np.concatenate([f[0] for f in feats])
    M = np.concatenate([f[1] for f in feats])
    T = np.concatenate([f[2] for f in feats])
    best = (float("inf"), None)
    mem = M[None, :] / (BANDWIDTHS_GBPS[:, None] * 1e9) * 1e3  # ms per node at each bandwidth
    for o in OVERHEADS_MS:
        for beta in BACKWARD_FACTORS:
            for p in PEAKS_GFLOPS:
                comp = F / (p * 1e9) * 1e3
                est = (1 + beta) * (np.maximum(comp[None, :], mem) + o)
                err = np.abs(est - T[None, :]).sum(axis=1) / T.sum()
                k = int(np.argmin(err))
                if err[k] < best[0]:
                    best = (
                        float(err[k]),
                        Roofline(float(p), float(BANDWIDTHS_GBPS[k]), float(beta), float(o)),
                    )
    return best[1], best[0]
