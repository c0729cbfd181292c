"""Closed-form cost of data-parallel training at scale: ring all-reduce, SSGD and skip-and-correct epochs.

Used to extrapolate measured single-machine figures to 8 ... 1024 workers and to check the
simulator. The models:

* Ring all-reduce of ``B`` bytes over ``N`` workers whose links run at ``bw`` bytes/s with ``a`` seconds
  latency per message (each worker sends and receives 2(N-1) chunks of B/N bytes; Patarasuk & Yuan 2009):

      T_ring = 2(N-1) * a + 2(N-1)/N * B / bw          (``topology="switch"``: every port has bw)
      T_ring = 2(N-1) * a + 2(N-1)   * B / bw          (``topology="shared"``: one segment carries all
                                                         N * 2(N-1)/N * B bytes, e.g. a shaped loopback)

* One epoch of S steps per worker, t_comp seconds of computation per step, no overlap of compute and
  communication:

      SSGD:              S * (t_comp + T_ring)
      skip-and-correct:  S * t_comp + ceil(S / H) * T_ring

Example:
    >>> from tf_commopt.core.scaling import ring_allreduce_s, epoch_time_s
    >>> round(ring_allreduce_s(1.08e6, 4, bandwidth_mbit=100, topology="shared"), 3)
    0.518
    >>> round(epoch_time_s(steps=100, t_comp_s=0.01, allreduce_s=0.2, interval=1), 2)
    21.0
    >>> round(epoch_time_s(steps=100, t_comp_s=0.01, allreduce_s=0.2, interval=20), 2)
    2.0
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

from tf_commopt.core.interval import first_iteration_interval
from tf_commopt.errors import InputError

__all__ = ["ring_allreduce_s", "epoch_time_s", "scaling_table"]


def ring_allreduce_s(
    nbytes: float, workers: int, bandwidth_mbit: float, latency_s: float = 0.0, topology: str = "switch"
) -> float:
    """Seconds for a ring all-reduce of ``nbytes`` over ``workers`` (see module docstring)."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise InputError(f"workers must be a positive integer, got {workers!r}")
    if not (math.isfinite(bandwidth_mbit) and bandwidth_mbit > 0):
        raise InputError(f"bandwidth_mbit must be positive, got {bandwidth_mbit!r}")
    if not (math.isfinite(nbytes) and nbytes >= 0) or not (math.isfinite(latency_s) and latency_s >= 0):
        raise InputError("nbytes and latency_s must be finite and non-negative")
    if workers == 1:
        return 0.0
    bw = bandwidth_mbit * 1e6 / 8.0
    n = workers
    if topology == "switch":
        volume = 2.0 * (n - 1) / n * nbytes
    elif topology == "shared":
        volume = 2.0 * (n - 1) * nbytes
    else:
        raise InputError(f"unknown topology {topology!r}; choose switch or shared")
    return 2.0 * (n - 1) * latency_s + volume / bw


def epoch_time_s(steps: int, t_comp_s: float, allreduce_s: float, interval: int = 1) -> float:
    """Epoch seconds: ``steps * t_comp + ceil(steps / interval) * allreduce`` (interval 1 = SSGD)."""
    if interval < 1:
        raise InputError(f"interval must be >= 1, got {interval}")
    return steps * t_comp_s + math.ceil(steps / interval) * allreduce_s


def scaling_table(
    workers: Sequence[int],
    model_bytes: float,
    t_comp_s: float,
    samples_per_epoch: int,
    batch_per_worker: int,
    bandwidth_mbit: float,
    latency_s: float = 0.0,
    interval: Optional[int] = None,
    target_ratio: float = 1.0,
    max_interval: int = 256,
) -> List[Dict[str, float]]:
    """Per worker count: SSGD and skip-and-correct epoch seconds, with H chosen by the thesis rule
    from (T_ring, t_comp) unless ``interval`` fixes it."""
    rows = []
    for n in workers:
        steps = max(1, math.ceil(samples_per_epoch / (n * batch_per_worker)))
        t_ar = ring_allreduce_s(model_bytes, n, bandwidth_mbit, latency_s)
        h = interval or first_iteration_interval(t_ar, t_comp_s, target_ratio, max_interval)
        ssgd = epoch_time_s(steps, t_comp_s, t_ar, 1)
        sc = epoch_time_s(steps, t_comp_s, t_ar, h)
        rows.append(
            {
                "workers": n,
                "steps": steps,
                "allreduce_s": t_ar,
                "interval": h,
                "ssgd_epoch_s": ssgd,
                "skip_correct_epoch_s": sc,
                "compute_only_epoch_s": steps * t_comp_s,
                "reduction": 1.0 - sc / ssgd,
            }
        )
    return rows
