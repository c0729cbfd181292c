"""``partition(graph, num_stages, method=...)``: every method behind one call, scored by one objective.

Example:
    >>> from tf_commopt.core.profiles import load_profile
    >>> from tf_commopt.core.partition.api import partition
    >>> g = load_profile("pipedream/vgg16")
    >>> plan = partition(g, 4, method="balanced", bandwidth_gbps=10.0)
    >>> plan.num_stages, sorted(set(plan.stage_of_node.values()))
    (4, [0, 1, 2, 3])

Methods (see the modules for the exact rules):

* ``layerwise``: equal node counts over the graph's topological order, devices in cluster order.
* ``balanced``: exact compute-balanced contiguous split (torchgpipe/DeepSpeed style).
* ``pipedream``: PipeDream's DP with overlapped communication (and, under the pipeline score, the
  fastest of its tied optima, :func:`baselines.pipedream_ties`).
* ``local``: seeds + memetic local search on the pipeline time (:mod:`pipesearch`); under
  ``score="objective"`` the objective's local search from the balanced and PipeDream plans.
* ``ga``: the same + the genetic algorithm (:mod:`evolve`, on DEAP) from all of them.

The search per method and score: :mod:`search`.

``score``: ``"pipeline"`` (default here) searches and chooses by :class:`pipemodel.PipelineModel` for
``schedule`` / ``microbatches`` (exact for GPipe); ``"simulated"`` makes the final choice with a ``rank``
callable (the planner, :mod:`tf_commopt.core.planner`, passes the simulator's; this package never
imports the simulator); ``"objective"`` is the additive objective alone.

Device placement: the plan uses the ``num_stages`` fastest devices. Every method tries the given
device order, fastest-first and slowest-first (heterogeneous clusters only) and keeps the best under
its score; ``local`` and ``ga`` then also swap devices.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Dict, Optional, Sequence, Tuple, Union

from tf_commopt.core.costgraph import CostGraph
from tf_commopt.core.devices import Cluster
from tf_commopt.core.partition.objective import Problem
from tf_commopt.core.partition.operators import Plan
from tf_commopt.core.partition.pipemodel import PipelineModel
from tf_commopt.core.partition.search import objective_search, pipeline_search
from tf_commopt.core.plan import PartitionPlan
from tf_commopt.errors import InputError, PlanError

__all__ = [
    "partition",
    "evaluate",
    "make_cluster",
    "cluster_record",
    "check_score",
    "default_microbatches",
    "METHODS",
    "SCORES",
    "SCHEDULES",
]

METHODS = ("layerwise", "balanced", "pipedream", "local", "ga")


def make_cluster(
    num_stages: int,
    capacities: Optional[Sequence[float]] = None,
    bandwidth_gbps: float = 10.0,
    latency_ms: float = 0.0,
    kinds: Union[None, str, Sequence[Optional[str]]] = None,
    cluster: Optional[Cluster] = None,
) -> Cluster:
    """The cluster a call describes: ``cluster`` as given, else one device per capacity (default all 1)."""
    if cluster is not None:
        if capacities is not None or kinds is not None:
            raise InputError("give either cluster or capacities/kinds, not both", where="partition()")
        return cluster
    caps = [1.0] * num_stages if capacities is None else list(capacities)
    if isinstance(kinds, str):
        kinds = [kinds] * len(caps)
    return Cluster.from_capacities(caps, bandwidth_gbps=bandwidth_gbps, latency_ms=latency_ms, kinds=kinds)


def _to_plan(
    p: Problem, method: str, stage: Sequence[int], devs: Sequence[int], search_s: float, extra: Dict
) -> PartitionPlan:
    p.check(stage, devs)
    ev = p.evaluate(stage, devs)
    g = p.graph
    son = {name: int(stage[p.index[name]]) for name in g.nodes}
    extra = dict(extra)
    extra.update(
        {
            "hop_bytes": ev.hop_bytes,
            "stage_penalty_ms": ev.stage_penalty_ms,
            "feasible": ev.feasible,
            "capacities": [p.cap[d] for d in devs],
            "kinds": [p.cluster.devices[d].kind for d in devs],
        }
    )
    return PartitionPlan(
        method=method,
        stage_of_node=son,
        device_of_stage=[int(d) for d in devs],
        stage_compute_ms=ev.stage_compute_ms,
        stage_comm_ms=ev.stage_comm_ms,
        stage_memory_bytes=ev.stage_memory_bytes,
        objective=ev.objective,
        comm_bytes=ev.comm_bytes,
        search_s=search_s,
        graph_name=g.name,
        extra=extra,
    )


SCORES = ("pipeline", "objective", "simulated")
SCHEDULES = ("gpipe", "1f1b")
Ranker = Callable[
    [Problem, Sequence[Plan], Callable[[Sequence[int], Sequence[int]], PartitionPlan], int], Tuple[Plan, Dict]
]


def default_microbatches(schedule: str, num_stages: int) -> int:
    """``4 K`` micro-batches for GPipe, ``8 K`` streamed mini-batches for 1F1B."""
    return (4 if schedule == "gpipe" else 8) * num_stages


def check_score(score: str, schedule: str, microbatches: Optional[int]) -> None:
    """InputError naming the argument if ``score``/``schedule``/``microbatches`` is not valid."""
    if score not in SCORES:
        raise InputError(f"unknown score {score!r}; choose from {', '.join(SCORES)}", where="score")
    if schedule not in SCHEDULES:
        raise InputError(
            f"unknown schedule {schedule!r}; choose from {', '.join(SCHEDULES)}", where="schedule"
        )
    if microbatches is not None and (
        isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1
    ):
        raise InputError(
            f"microbatches must be a positive integer, got {microbatches!r}", where="microbatches"
        )


def cluster_record(cl: Cluster, memory: Union[None, float, Sequence[Optional[float]]] = None) -> Dict:
    """The JSON record of a cluster a plan was made for (every device, the default link)."""
    if memory is None:
        mem = [d.memory_bytes for d in cl.devices]
    elif isinstance(memory, (int, float)) and not isinstance(memory, bool):
        mem = [float(memory)] * len(cl)
    else:
        mem = list(memory)
    return {
        "capacities": [float(d.capacity) for d in cl.devices],
        "kinds": [d.kind for d in cl.devices],
        "bandwidth_gbps": cl.default_link.bandwidth_gbps,
        "latency_ms": cl.default_link.latency_ms,
        "memory_bytes": mem,
    }


def partition(
    graph: CostGraph,
    num_stages: int,
    method: str = "ga",
    capacities: Optional[Sequence[float]] = None,
    bandwidth_gbps: float = 10.0,
    latency_ms: float = 0.0,
    memory: Union[None, float, Sequence[Optional[float]]] = None,
    seed: int = 0,
    cluster: Optional[Cluster] = None,
    kinds: Union[None, str, Sequence[Optional[str]]] = None,
    progress: Optional[Callable[[int, int, float], None]] = None,
    score: str = "pipeline",
    schedule: str = "gpipe",
    microbatches: Optional[int] = None,
    rank: Optional[Ranker] = None,
) -> PartitionPlan:
    """Partition ``graph`` into ``num_stages`` convex pipeline stages.

    Args:
        graph: the CostGraph.
        num_stages: K (<= nodes, <= devices).
        method: one of :data:`METHODS`.
        capacities: relative speed per device (default: ``num_stages`` devices of speed 1).
        bandwidth_gbps, latency_ms: the link between consecutive stages.
        memory: memory cap in bytes for every device, or a list per device.
        seed: the GA's / local search's seed (same seed, same plan).
        cluster: a full :class:`Cluster` instead of capacities/kinds/bandwidth.
        kinds: device kind per device (or one for all), naming per-kind costs of the graph.
        progress: ``progress(generation, generations, best_ms)`` called by the GA.
        score: ``"pipeline"`` (default): search and choose by the time of ``schedule`` with
            ``microbatches`` (:mod:`pipemodel`; exact for GPipe); ``"simulated"``: the same search, the
            final choice by ``rank`` (the planner passes the simulator, :mod:`tf_commopt.core.planner`);
            ``"objective"``: the additive objective of :mod:`objective` only.
        schedule: ``"gpipe"`` (iteration time) or ``"1f1b"`` (time per mini-batch in steady state; the
            memory model then counts stashed weight versions).
        microbatches: GPipe micro-batches per mini-batch (default ``4 * num_stages``); for 1F1B the
            number simulated by ``rank`` (default ``8 * num_stages``).
        rank: ``rank(problem, candidates, to_plan, n_baselines) -> ((stage, devs), info)``, required by
            ``"simulated"``; the first ``n_baselines`` candidates are the baseline plans.

    Example:
        >>> from tf_commopt.core.partition.synthetic import branchy_graph
        >>> plan = partition(branchy_graph(60, seed=1), 3, method="ga", schedule="gpipe")
        >>> plan.schedule, plan.microbatches, plan.extra["score"]
        ('gpipe', 12, 'pipeline')
    """
    if method not in METHODS:
        raise InputError(f"unknown method {method!r}; choose from {', '.join(METHODS)}", where="method")
    if not isinstance(graph, CostGraph):
        raise InputError(f"graph must be a CostGraph, got {type(graph).__name__}", where="graph")
    check_score(score, schedule, microbatches)
    if score == "simulated" and rank is None:
        raise InputError(
            "score='simulated' needs the simulator: call tf_commopt.core.planner.partition "
            "(or tf_commopt.partition.partition)",
            where="score",
        )
    cl = make_cluster(num_stages, capacities, bandwidth_gbps, latency_ms, kinds, cluster)
    for d in cl.devices:
        if d.kind is not None and d.kind not in graph.kinds:
            raise InputError(
                f"device kind {d.kind!r} has no costs in the graph (kinds: {graph.kinds or 'none'})",
                where=f"device {d.name!r}",
            )
    t0 = time.perf_counter()
    m = microbatches or default_microbatches(schedule, num_stages)
    p = Problem(graph, cl, num_stages, memory, stash_weights=(schedule == "1f1b" and score != "objective"))
    extra: Dict = {
        "bandwidth_gbps": cl.default_link.bandwidth_gbps,
        "latency_ms": cl.default_link.latency_ms,
        "seed": seed,
        "score": score,
    }
    if score == "objective":
        found = objective_search(p, method, seed, progress)
    else:
        found = pipeline_search(p, method, seed, progress, PipelineModel(p, schedule, m))
    extra.update(found.extra)
    stage, devs = found.best
    if rank is not None and method in ("local", "ga"):
        n = len(found.baselines)
        (stage, devs), info = rank(
            p, found.candidates, lambda s_, d_: _to_plan(p, "candidate", s_, d_, 0.0, {}), n
        )
        extra.update(info)
    plan = _to_plan(p, method, stage, devs, time.perf_counter() - t0, extra)
    return dataclasses.replace(plan, cluster=cluster_record(cl, memory), schedule=schedule, microbatches=m)


def evaluate(
    graph: CostGraph,
    stage_of_node: Dict[str, int],
    device_of_stage: Optional[Sequence[int]] = None,
    capacities: Optional[Sequence[float]] = None,
    bandwidth_gbps: float = 10.0,
    latency_ms: float = 0.0,
    memory: Union[None, float, Sequence[Optional[float]]] = None,
    cluster: Optional[Cluster] = None,
    kinds: Union[None, str, Sequence[Optional[str]]] = None,
    method: str = "given",
) -> PartitionPlan:
    """Score a given assignment (node name -> stage) with the objective; PlanError if not convex."""
    missing = [n for n in graph.nodes if n not in stage_of_node]
    if missing:
        raise PlanError(f"node {missing[0]!r} has no stage")
    K = max(stage_of_node.values()) + 1
    cl = make_cluster(K, capacities, bandwidth_gbps, latency_ms, kinds, cluster)
    p = Problem(graph, cl, K, memory)
    devs = list(device_of_stage) if device_of_stage is not None else list(range(K))
    stage = [stage_of_node[n] for n in p.order]
    return _to_plan(p, method, stage, devs, 0.0, {})
