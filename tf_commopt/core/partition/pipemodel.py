"""The pipeline model: the time of a plan under the schedule that will run it, in closed form.

The partitioner's additive objective (:mod:`objective`) charges each stage its compute *plus* its
transfers; a pipeline overlaps them. This model gives the time per mini-batch of the discrete-event
simulator (:mod:`tf_commopt.core.simulate`) for the same costs (the shared rule of
:mod:`tf_commopt.core.stagecost`), without running it:

* **GPipe** (``M`` micro-batches per mini-batch, each ``1/M`` of the profiled costs and bytes): the
  forward phase is a flow shop of identical jobs over the machines ``f_0, x_0, f_1, x_1, ..., f_{K-1}``
  (stage forward times and act-link transfer times per micro-batch), the backward phase one over
  ``b_{K-1}, y_{K-2}, ..., b_0`` (gradient links are the other direction of each link, so the phases
  share no link) and it starts when the last stage's forwards end. A flow shop of ``M`` identical jobs
  takes ``sum p + (M - 1) max p`` (every path through the job x machine grid visits each machine once
  and one machine ``M`` times) plus the latencies, so

  ``T = sum f + sum x + (M-1) max(f, x) + sum b + sum y + (M-1) max(b, y) + 2 sum lat + optimizer``

  with ``lat`` counted on hops that carry bytes. This is **exact** for the engine (tested against the
  simulator on random DAGs, devices and links in ``tests/core/test_partition_pipeline.py``).
* **1F1B** (PipeDream, weight stashing; every micro-batch a profiled mini-batch): the steady-state
  period is the largest cycle mean of the schedule's event graph. On stage ``t`` the forward of
  micro-batch ``i`` precedes the backward of ``i - (K - t) + 1``, so a micro-batch's forward from stage
  ``s`` down to ``t``, then the backward ``K - t - 1`` micro-batches older back up to ``s``, then the
  forward ``t - s + 1`` micro-batches later on ``s`` closes a cycle with ``t - s + 1`` micro-batches in
  flight. The model takes these cycles and each link direction alone:
  ``max( max_{s<=t} (sum_{u=s..t} f_u + b_u + sum_{h=s..t-1} x_h + y_h + 2 lat_h + optimizer) / (t - s + 1),
  max_h x_h, max_h y_h )`` (``s = t``: a device's own ``f + b``). Cycles through a link's queue are left
  out, so it can be optimistic where transfers queue; the planner ranks the final candidates in the
  simulator itself (:mod:`tf_commopt.core.planner`).

Memory penalties of :class:`Problem` are added to the time (a plan that fits beats one that does not).

Example:
    >>> from tf_commopt.core.costgraph import CostGraph, Node
    >>> from tf_commopt.core.devices import Cluster
    >>> from tf_commopt.core.partition.objective import Problem
    >>> from tf_commopt.core.partition.pipemodel import PipelineModel
    >>> g = CostGraph([Node("a", 1, 2, activation_bytes=0), Node("b", 1, 2)], [("a", "b")])
    >>> m = PipelineModel(Problem(g, Cluster.homogeneous(2), 2), "gpipe", microbatches=2)
    >>> m.time([0, 1], [0, 1])          # (M + K - 1)(t_f + t_b) = 3 * 1.5
    4.5
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

from tf_commopt.core.partition.objective import Problem
from tf_commopt.core.stagecost import EPS_BYTES, hop_bytes_array
from tf_commopt.errors import InputError

__all__ = ["PipelineModel", "MODEL_SCHEDULES"]

MODEL_SCHEDULES = ("gpipe", "1f1b")


class PipelineModel:
    """Closed-form time per mini-batch of a plan of ``p`` under ``schedule`` (see module docstring).

    Args:
        p: the Problem (graph, cluster, K, memory caps).
        schedule: ``"gpipe"`` or ``"1f1b"``.
        microbatches: GPipe: micro-batches per mini-batch (costs and bytes divided by it); 1F1B: unused
            (the steady state does not depend on it).
        optimizer_ms: cost of each optimizer step on every stage.
    """

    def __init__(self, p: Problem, schedule: str = "gpipe", microbatches: int = 4, optimizer_ms: float = 0.0):
        if schedule not in MODEL_SCHEDULES:
            raise InputError(
                f"unknown schedule {schedule!r}; choose from {', '.join(MODEL_SCHEDULES)}", where="schedule"
            )
        if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
            raise InputError(
                f"microbatches must be a positive integer, got {microbatches!r}", where="microbatches"
            )
        self.p, self.schedule, self.M, self.opt = p, schedule, microbatches, float(optimizer_ms)
        self.split = microbatches if schedule == "gpipe" else 1

    # ------------------------------------------------------------------ the formula
    def from_parts(
        self,
        fwd: Sequence[float],
        comp: Sequence[float],
        hop: Sequence[float],
        devs: Sequence[int],
        penalty: float = 0.0,
    ) -> float:
        """Time from per-stage raw forward / forward+backward ms (before capacity), hop bytes, devices."""
        p, K, split = self.p, len(devs), self.split
        f = [0.0] * K
        b = [0.0] * K
        for s, d in enumerate(devs):
            c = p.cap[d]
            f[s] = fwd[s] / c / split
            b[s] = (comp[s] - fwd[s]) / c / split
        x, y, lat = [], [], 0.0
        for h in range(K - 1):
            nb = hop[h] / split
            if hop[h] <= EPS_BYTES:
                x.append(0.0)
                y.append(0.0)
                continue
            da, db = devs[h], devs[h + 1]
            x.append(nb / p.bpm[da][db])
            y.append(nb / p.bpm[db][da])
            lat += p.lat[da][db] + p.lat[db][da]
        if self.schedule == "gpipe":
            M = self.M
            t = (
                sum(f)
                + sum(x)
                + (M - 1) * max(f + x)
                + sum(b)
                + sum(y)
                + (M - 1) * max(b + y)
                + lat
                + self.opt
            )
            return t + penalty
        period = max(max(x, default=0.0), max(y, default=0.0))
        lat_h = [
            (p.lat[devs[h]][devs[h + 1]] + p.lat[devs[h + 1]][devs[h]]) if hop[h] > EPS_BYTES else 0.0
            for h in range(K - 1)
        ]
        for s in range(K):  # stages s..t: t - s + 1 micro-batches in flight
            tail = self.opt
            for t in range(s, K):
                if t > s:
                    tail += x[t - 1] + y[t - 1] + lat_h[t - 1]
                tail += f[t] + b[t]
                if tail / (t - s + 1) > period:
                    period = tail / (t - s + 1)
        return period + penalty

    # ------------------------------------------------------------------ full evaluation
    def parts(
        self, stage: Sequence[int], devs: Sequence[int]
    ) -> Tuple[List[float], List[float], List[float], float]:
        """(forward ms per stage, compute ms per stage, hop bytes, worst memory penalty) of a plan (raw ms)."""
        p, K = self.p, len(devs)
        st = np.asarray(stage, dtype=np.int64)
        fwd, comp = [0.0] * K, [0.0] * K
        per_f = [np.bincount(st, weights=p.fwd[k], minlength=K) for k in range(len(p.kinds))]
        per_c = [np.bincount(st, weights=p.comp[k], minlength=K) for k in range(len(p.kinds))]
        for s, d in enumerate(devs):
            k = p.kind_of_dev[d]
            fwd[s], comp[s] = float(per_f[k][s]), float(per_c[k][s])
        hop = hop_bytes_array(st, p.eu, p.ev, p.act, K)
        par = np.bincount(st, weights=p.param, minlength=K)
        acts = np.bincount(st, weights=p.act, minlength=K)
        pen = max(
            p.penalty_ms(float(p.weight_versions[s] * par[s] + (K - s) * acts[s]), devs[s]) for s in range(K)
        )
        return fwd, comp, hop, pen

    def time(self, stage: Sequence[int], devs: Sequence[int]) -> float:
        """Modelled ms per mini-batch (GPipe iteration, or 1F1B steady-state period), penalties included."""
        fwd, comp, hop, pen = self.parts(stage, devs)
        return self.from_parts(fwd, comp, hop, devs, pen)
