"""The grouped hybrid's plan: groups, each group's pipeline, micro-batches and the batch split.

Example:
    >>> from tf_commopt.core.costgraph import CostGraph, Node
    >>> from tf_commopt.core.devices import Cluster
    >>> from tf_commopt.core.planner.hybrid import plan_hybrid
    >>> g = CostGraph([Node(f"l{i}", 1.0, 2.0) for i in range(6)], [(f"l{i}", f"l{i+1}") for i in range(5)])
    >>> hp = plan_hybrid(g, Cluster.from_capacities([1, 1, 0.5]), num_groups=2, microbatches=2)
    >>> hp.groups, [p.num_stages for p in hp.plans], [round(f, 3) for f in hp.batch_fractions]
    ([[0], [1, 2]], [1, 2], [0.5, 0.5])

:func:`plan_hybrid` is the one function the TensorFlow executor
(:class:`tf_commopt.distribute.hybrid.GroupedHybridTrainer`) and the simulator's callers
(:func:`tf_commopt.core.simulate.hybrid.simulate_grouped_hybrid`, :mod:`hybrid_search`) take a
grouped hybrid plan from, with the same defaults:

* **groups**: given, or ``num_groups`` groups by ``grouping`` (:mod:`groups`, default ``snake``) of the
  devices' speeds;
* **plans**: per group of two or more devices, :func:`tf_commopt.core.planner.partition` on the group's
  devices and links (``method``, default ``ga``; GPipe with the hybrid's ``microbatches``); with
  several methods, the plan whose pipeline alone simulates fastest; one device: the whole graph;
* **batch split**: group ``g``'s share is ``(1/t_g) / sum_h (1/t_h)``, ``t_g`` its pipeline alone on
  the whole mini-batch in the simulator (:func:`tf_commopt.core.simulate.hybrid.group_alone_ms`),
  unless ``weights`` are given.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple, Union

from tf_commopt.core.costgraph import CostGraph
from tf_commopt.core.devices import Cluster
from tf_commopt.core.plan import HybridPlan, PartitionPlan, single_stage_plan
from tf_commopt.core.planner.api import partition
from tf_commopt.core.planner.groups import GROUPINGS
from tf_commopt.core.schedule.hybrid import check_groups
from tf_commopt.core.simulate.hybrid import ClusterLike, as_cluster, device_speeds, group_alone_ms
from tf_commopt.errors import InputError

__all__ = ["group_plans", "plan_hybrid", "replicated_plan"]

Methods = Union[str, Sequence[str]]


def method_list(method: Methods) -> List[str]:
    methods = [method] if isinstance(method, str) else list(method)
    if not methods:
        raise InputError("no partition method given", where="method")
    return methods


def _group_key(sub: Cluster, methods: Sequence[str], microbatches: int, seed: int, graph: CostGraph) -> Tuple:
    return (
        tuple((d.capacity, d.kind, d.memory_bytes) for d in sub.devices),
        sub.default_link,
        tuple(sorted(sub.links.items())),
        tuple(methods),
        microbatches,
        seed,
        id(graph),
    )


def group_plans(
    graph: CostGraph,
    cluster: Cluster,
    groups: Sequence[Sequence[int]],
    method: Methods = "ga",
    microbatches: int = 4,
    seed: int = 0,
    cache: Optional[Dict] = None,
) -> List[PartitionPlan]:
    """One plan per group (``device_of_stage`` indexes the group's devices), see the module docstring.

    ``cache`` (a dict) reuses plans between groups of the same devices (capacity, kind, links).
    """
    methods = method_list(method)
    out = []
    for group in groups:
        if len(group) == 1:
            out.append(single_stage_plan(graph))
            continue
        sub = cluster.subset(group)
        key = _group_key(sub, methods, microbatches, seed, graph)
        if cache is not None and key in cache:
            out.append(cache[key])
            continue
        best, best_ms = None, float("inf")
        for m in methods:
            plan = partition(graph, len(group), method=m, cluster=sub, seed=seed, microbatches=microbatches)
            ms = group_alone_ms(graph, sub, plan, _one_each(plan), microbatches) if len(methods) > 1 else 0.0
            if best is None or ms < best_ms:
                best, best_ms = plan, ms
        if cache is not None:
            cache[key] = best
        out.append(best)
    return out


def _one_each(plan: PartitionPlan) -> List[Tuple[int, ...]]:
    return [(d,) for d in plan.device_of_stage]


def plan_hybrid(
    graph: CostGraph,
    cluster: ClusterLike,
    groups: Optional[Sequence[Sequence[int]]] = None,
    num_groups: int = 1,
    microbatches: int = 4,
    method: Methods = "ga",
    seed: int = 0,
    plans: Optional[Sequence[PartitionPlan]] = None,
    weights: Optional[Sequence[float]] = None,
    grouping: str = "snake",
    optimizer_ms: float = 0.0,
    cache: Optional[Dict] = None,
) -> HybridPlan:
    """The grouped hybrid plan of ``graph`` on ``cluster`` (see the module docstring).

    Args:
        graph: the model's cost graph.
        cluster: a Cluster, or capacities.
        groups: lists of device indices, one pipeline each (default: ``num_groups`` by ``grouping``).
        num_groups: G when ``groups`` is not given.
        microbatches: GPipe micro-batches per group per mini-batch.
        method: partition method(s) for the groups' plans.
        seed: the partitioner's seed.
        plans: one plan per group instead of partitioning (their alone times still give the split).
        weights: the groups' throughputs for the batch split instead of ``1 / t_g``.
        grouping: ``"snake"`` or ``"contiguous"``.
        optimizer_ms: cost of each optimizer step (counted in ``t_g``).
        cache: reuse group plans across calls (a dict).
    """
    cl = as_cluster(cluster)
    if groups is None:
        if grouping not in GROUPINGS:
            raise InputError(
                f"unknown grouping {grouping!r}; choose from {sorted(GROUPINGS)}", where="grouping"
            )
        groups = GROUPINGS[grouping](device_speeds(graph, cl), num_groups)
    else:
        grouping = "given"
    gs = check_groups(groups, len(cl))
    if plans is None:
        plans = group_plans(graph, cl, gs, method, microbatches, seed, cache)
    elif len(plans) != len(gs):
        raise InputError(f"{len(plans)} plans for {len(gs)} groups", where="plans")
    hp = HybridPlan(gs, list(plans), microbatches, [1.0] * len(gs), grouping=grouping)
    ms = [
        group_alone_ms(graph, cl, p, hp.devices_of_stage(g), microbatches, optimizer_ms)
        for g, p in enumerate(hp.plans)
    ]
    hp = HybridPlan(gs, list(plans), microbatches, ms, grouping=grouping)
    return hp if weights is None else hp.with_weights(weights)


def replicated_plan(
    graph: CostGraph,
    cluster: ClusterLike,
    sets: Sequence[Sequence[int]],
    microbatches: int = 4,
    method: str = "ga",
    seed: int = 0,
    shape: str = "given",
    optimizer_ms: float = 0.0,
) -> HybridPlan:
    """One pipeline whose stage ``s`` is replicated on the devices of one of ``sets``.

    The plan is :func:`tf_commopt.core.planner.partition` on *virtual devices*, one per set, of the
    set's total capacity (and its kind if all its devices share one); ``stage_devices`` maps each
    stage to its set.
    """
    cl = as_cluster(cluster)
    caps, kinds = [], []
    for reps in sets:
        caps.append(sum(cl.devices[d].capacity for d in reps))
        ks = {cl.devices[d].kind for d in reps}
        kinds.append(ks.pop() if len(ks) == 1 else None)
    virt = Cluster.from_capacities(
        caps, cl.default_link.bandwidth_gbps, cl.default_link.latency_ms, kinds=kinds
    )
    plan = partition(graph, len(sets), method=method, cluster=virt, seed=seed, microbatches=microbatches)
    sdev = [tuple(sorted(sets[plan.device_of_stage[s]])) for s in range(plan.num_stages)]
    flat = sorted(d for reps in sdev for d in reps)
    ms = group_alone_ms(graph, cl, plan, sdev, microbatches, optimizer_ms)
    return HybridPlan([flat], [plan], microbatches, [ms], None, [sdev], f"replicated:{shape}")
