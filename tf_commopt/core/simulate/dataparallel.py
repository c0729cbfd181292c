"""Simulate data-parallel iterations (synchronous SGD, local SGD) on possibly heterogeneous devices.

The binding rules: worker ``w`` runs on device ``w`` of the cluster and processes the fraction
``f_w`` of the profiled mini-batch (default ``1/N`` each: the profiled batch is the global batch); its
forward time is ``f_w * sum_v forward_ms(v, kind) / capacity`` (backward alike, divided by the
micro-batches of gradient accumulation). The gradients (synchronous SGD) or the parameters (local SGD)
are ``CostGraph.total_param_bytes()`` and travel by ring all-reduce
(:func:`tf_commopt.core.simulate.engine.ring_allreduce_ms`).

Example:
    >>> from tf_commopt.core.costgraph import CostGraph, Node
    >>> from tf_commopt.core.devices import Cluster
    >>> from tf_commopt.core.simulate.dataparallel import simulate_data_parallel
    >>> g = CostGraph([Node("w", 4.0, 8.0, param_bytes=1.25e6)], [])
    >>> r = simulate_data_parallel(g, Cluster.homogeneous(4, bandwidth_gbps=10.0))
    >>> r.iteration_ms        # 12/4 ms compute + 2*3/4 * 1.25e6 B / 1.25e6 B/ms
    4.5
"""

from __future__ import annotations

from typing import Optional, Sequence

from tf_commopt.core.costgraph import CostGraph
from tf_commopt.core.devices import Cluster
from tf_commopt.core.schedule.dataparallel import data_parallel, local_sgd
from tf_commopt.core.simulate.engine import Job, RankCost
from tf_commopt.core.simulate.result import SimResult, simulate_job
from tf_commopt.errors import InputError

__all__ = ["data_parallel_job", "simulate_data_parallel", "simulate_local_sgd"]


def _ranks(
    graph: CostGraph,
    cluster: Cluster,
    fractions: Optional[Sequence[float]],
    per_step: int,
    optimizer_ms: float,
):
    n = len(cluster)
    if fractions is None:
        fractions = [1.0 / n] * n
    fractions = [float(f) for f in fractions]
    if len(fractions) != n or any(not f > 0 for f in fractions):
        raise InputError(
            f"batch_fractions must be {n} positive numbers, got {fractions}", where="batch_fractions"
        )
    ranks = []
    for w, dev in enumerate(cluster.devices):
        f = sum(graph.forward_ms(v, dev.kind) for v in graph.nodes)
        b = sum(graph.backward_ms(v, dev.kind) for v in graph.nodes)
        scale = fractions[w] / dev.capacity / per_step
        ranks.append(RankCost(w, f * scale, b * scale, optimizer_ms))
    return ranks


def data_parallel_job(
    graph: CostGraph,
    cluster: Cluster,
    microbatches: int = 1,
    batch_fractions: Optional[Sequence[float]] = None,
    optimizer_ms: float = 0.0,
) -> Job:
    """Synchronous data parallelism bound to the graph's costs (see module docstring)."""
    sched = data_parallel(len(cluster), microbatches)
    ranks = _ranks(graph, cluster, batch_fractions, microbatches, optimizer_ms)
    return Job(sched, ranks, cluster, {}, {"grads": graph.total_param_bytes()}, split=microbatches)


def simulate_data_parallel(
    graph: CostGraph,
    cluster: Cluster,
    microbatches: int = 1,
    batch_fractions: Optional[Sequence[float]] = None,
    optimizer_ms: float = 0.0,
) -> SimResult:
    """One synchronous data-parallel iteration: compute, ring all-reduce of the gradients, update."""
    return simulate_job(data_parallel_job(graph, cluster, microbatches, batch_fractions, optimizer_ms))


def simulate_local_sgd(
    graph: CostGraph,
    cluster: Cluster,
    interval: int,
    batch_fractions: Optional[Sequence[float]] = None,
    optimizer_ms: float = 0.0,
) -> SimResult:
    """One averaging period of local SGD (``interval`` local steps, one parameter all-reduce);
    ``iteration_ms`` is the mean time per step."""
    sched = local_sgd(len(cluster), interval)
    ranks = _ranks(graph, cluster, batch_fractions, 1, optimizer_ms)
    return simulate_job(Job(sched, ranks, cluster, {}, {"params": graph.total_param_bytes()}, split=1))
