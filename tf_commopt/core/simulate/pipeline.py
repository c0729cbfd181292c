"""Simulate a pipeline schedule for a CostGraph + PartitionPlan + Cluster.

The binding rules (the shared rule of :mod:`tf_commopt.core.stagecost`, as the partitioner's objective):

* stage ``s`` runs on device ``d = plan.device_of_stage[s]``; its forward time per mini-batch is
  ``sum_{v in s} CostGraph.forward_ms(v, kind(d)) / capacity(d)`` (backward alike);
* node ``u``'s output travels from ``stage(u)`` to the largest stage of its consumers, relayed hop by
  hop over every boundary ``h -> h+1`` in between, counted once per hop however many consumers lie
  beyond (:func:`hop_bytes`); the gradients flow back over the same hops with the same bytes;
* a mini-batch split into ``M`` micro-batches: each micro-batch costs ``1/M`` of the profiled time and
  carries ``1/M`` of the bytes. A ``micro_profile`` (a CostGraph profiled at the micro-batch size)
  overrides this: its times and bytes are used as they are.

Example:
    >>> from tf_commopt.core.costgraph import CostGraph, Node
    >>> from tf_commopt.core.plan import PartitionPlan
    >>> from tf_commopt.core.simulate.pipeline import simulate_pipeline
    >>> g = CostGraph([Node("a", 2, 4, activation_bytes=0), Node("b", 2, 4)], [("a", "b")])
    >>> plan = PartitionPlan("x", {"a": 0, "b": 1}, [0, 1], [6, 6], [0, 0], [0, 0], 6, 0)
    >>> r = simulate_pipeline(g, plan, "gpipe", microbatches=2)
    >>> r.iteration_ms                     # (M + P - 1)(t_f + t_b) = 3 * (1 + 2)
    9.0
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Tuple, Union

from tf_commopt.core import stagecost
from tf_commopt.core.costgraph import CostGraph
from tf_commopt.core.devices import Cluster
from tf_commopt.core.plan import PartitionPlan
from tf_commopt.core.schedule import SCHEDULES, Schedule
from tf_commopt.core.simulate.engine import Job, RankCost
from tf_commopt.core.simulate.result import SimResult, simulate_job
from tf_commopt.errors import InputError, PlanError

__all__ = ["hop_bytes", "stage_costs", "pipeline_job", "simulate_pipeline"]


def _stages(graph: CostGraph, plan: PartitionPlan) -> Dict[str, int]:
    where = f"plan {plan.method!r}"
    son = plan.stage_of_node
    missing = [n for n in graph.topological_order() if n not in son]
    if missing:
        raise PlanError(
            f"node {missing[0]!r} of graph {graph.name!r} has no stage ({len(missing)} missing)", where=where
        )
    extra = [n for n in son if n not in graph]
    if extra:
        raise PlanError(f"plan names node {extra[0]!r} that graph {graph.name!r} lacks", where=where)
    for a, b in graph.edges:
        if son[a] > son[b]:
            raise PlanError(
                f"edge {a!r} -> {b!r} goes back from stage {son[a]} to stage {son[b]}", where=where
            )
    return son


def hop_bytes(graph: CostGraph, stage_of_node: Mapping[str, int], num_stages: int) -> List[float]:
    """Bytes (per mini-batch, forward direction) crossing each boundary ``h -> h+1``: the shared rule
    :func:`tf_commopt.core.stagecost.hop_bytes` (the partitioner's objective uses the same function).

    >>> from tf_commopt.core.costgraph import CostGraph, Node
    >>> g = CostGraph([Node("a", 1, 1, activation_bytes=10), Node("b", 1, 1, activation_bytes=3),
    ...                Node("c", 1, 1)], [("a", "b"), ("b", "c"), ("a", "c")])
    >>> hop_bytes(g, {"a": 0, "b": 1, "c": 2}, 3)      # a's output is relayed through stage 1
    [10.0, 13.0]
    """
    return [
        h if h > stagecost.EPS_BYTES else 0.0 for h in stagecost.hop_bytes(graph, stage_of_node, num_stages)
    ]


def stage_costs(graph: CostGraph, plan: PartitionPlan, cluster: Cluster) -> List[Tuple[float, float]]:
    """``(forward_ms, backward_ms)`` of each stage per mini-batch on its device (capacity and kind applied)."""
    son = _stages(graph, plan)
    k = plan.num_stages
    if len(cluster) <= max(plan.device_of_stage):
        raise PlanError(
            f"plan places a stage on device {max(plan.device_of_stage)} but the cluster has "
            f"{len(cluster)} device(s)",
            where=f"plan {plan.method!r}",
        )
    costs = []
    for s in range(k):
        dev = cluster.devices[plan.device_of_stage[s]]
        f = b = 0.0
        for n, st in son.items():
            if st == s:
                f += graph.forward_ms(n, dev.kind)
                b += graph.backward_ms(n, dev.kind)
        costs.append((f / dev.capacity, b / dev.capacity))
    return costs


def pipeline_job(
    graph: CostGraph,
    plan: PartitionPlan,
    schedule: Union[str, Schedule] = "gpipe",
    microbatches: int = 4,
    cluster: Optional[Cluster] = None,
    bandwidth_gbps: float = 10.0,
    latency_ms: float = 0.0,
    split: Optional[int] = None,
    micro_profile: Optional[CostGraph] = None,
    optimizer_ms: float = 0.0,
) -> Job:
    """Bind a pipeline schedule to the graph's costs (see :func:`simulate_pipeline` for the arguments)."""
    k = plan.num_stages
    if isinstance(schedule, str):
        if schedule not in SCHEDULES:
            raise InputError(
                f"unknown schedule {schedule!r}; choose one of {sorted(SCHEDULES)}", where="schedule"
            )
        sched = SCHEDULES[schedule](k, microbatches)
    else:
        sched = schedule
    if sched.num_ranks != k:
        raise PlanError(
            f"schedule has {sched.num_ranks} ranks, plan has {k} stages", where=f"plan {plan.method!r}"
        )
    if cluster is None:
        cluster = Cluster.homogeneous(max(plan.device_of_stage) + 1, bandwidth_gbps, latency_ms)
    if split is None:
        split = sched.microbatches_per_minibatch if sched.synchronous else 1
    if isinstance(split, bool) or not isinstance(split, int) or split < 1:
        raise InputError(f"split must be a positive integer, got {split!r}", where="split")
    costed = micro_profile if micro_profile is not None else graph
    scale = 1.0 if micro_profile is not None else 1.0 / split
    costs = stage_costs(costed, plan, cluster)
    hops = hop_bytes(costed, plan.stage_of_node, k)
    ranks = [
        RankCost(plan.device_of_stage[s], f * scale, b * scale, optimizer_ms)
        for s, (f, b) in enumerate(costs)
    ]
    msgs: Dict[Tuple[str, int, int], float] = {}
    for h, nbytes in enumerate(hops):
        msgs[("act", h, h + 1)] = nbytes * scale
        msgs[("grad", h + 1, h)] = nbytes * scale
    return Job(sched, ranks, cluster, msgs, {}, split=split)


def simulate_pipeline(
    graph: CostGraph,
    plan: PartitionPlan,
    schedule: Union[str, Schedule] = "gpipe",
    microbatches: int = 4,
    cluster: Optional[Cluster] = None,
    bandwidth_gbps: float = 10.0,
    latency_ms: float = 0.0,
    split: Optional[int] = None,
    micro_profile: Optional[CostGraph] = None,
    optimizer_ms: float = 0.0,
) -> SimResult:
    """Simulate ``schedule`` for ``plan`` of ``graph``.

    Args:
        graph: the CostGraph the plan partitions (times and bytes per profiled mini-batch).
        plan: stage of each node and device of each stage.
        schedule: ``"gpipe"``, ``"1f1b"`` or a :class:`Schedule` with one rank per stage.
        microbatches: micro-batches in the run (GPipe: per mini-batch; 1F1B: streamed through).
        cluster: devices and links; default ``Cluster.homogeneous`` with ``bandwidth_gbps``/``latency_ms``.
        split: micro-batches per profiled mini-batch (costs and bytes divided by it). Default: the
            schedule's ``microbatches_per_minibatch`` for a synchronous schedule (GPipe: ``M``), 1 for
            asynchronous 1F1B (each micro-batch is a PipeDream mini-batch).
        micro_profile: a CostGraph measured at the micro-batch size; its costs are used undivided.
        optimizer_ms: cost of each ``OptimizerStep`` on every stage.

    Returns:
        SimResult with iteration_ms, throughput (mini-batches/s), bubble_fraction, busy_ms per device,
        bytes_injected per mini-batch and the timeline.
    """
    job = pipeline_job(
        graph,
        plan,
        schedule,
        microbatches,
        cluster,
        bandwidth_gbps,
        latency_ms,
        split,
        micro_profile,
        optimizer_ms,
    )
    res = simulate_job(job)
    res.extra["stages"] = plan.num_stages
    res.extra["method"] = plan.method
    return res
