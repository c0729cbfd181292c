"""Grouped hybrid parallelism vs data parallelism on heterogeneous devices, simulated (pure).

Example:
    >>> from tf_commopt.core.costgraph import CostGraph, Node
    >>> from tf_commopt.core.devices import Cluster
    >>> from tf_commopt.core.simulate.hybrid import (
    ...     ideal_iteration_ms, simulate_dp, simulate_grouped_hybrid)
    >>> g = CostGraph([Node(f"l{i}", 1.0, 2.0) for i in range(6)], [(f"l{i}", f"l{i+1}") for i in range(5)])
    >>> c = Cluster.from_capacities([1, 0.5])
    >>> simulate_dp(g, c).iteration_ms             # straggler: 18 ms / 2 / 0.5
    18.0
    >>> round(ideal_iteration_ms(g, c), 3)         # 18 ms / (1 + 0.5)
    12.0
    >>> r = simulate_grouped_hybrid(g, c, [[0, 1]], microbatches=3, method="balanced")
    >>> r.extra["stage_layers"], round(r.iteration_ms, 6)    # 4 : 2 layers, GPipe (M + P - 1) * 4 ms
    ([[4, 2]], 16.0)

The grouped hybrid (rules: :mod:`tf_commopt.core.hybrid`, shared with the TensorFlow executor) bound
to the simulator's engine (:mod:`tf_commopt.core.simulate.engine`). The binding rules:

* **Speed.** Device ``d`` processes ``speed_d = capacity_d / graph.total_ms(kind_d)`` profiled
  mini-batches per ms. **Ideal**: ``1 / sum_d speed_d`` (all compute shared, no communication, no
  bubble: a lower bound for any synchronous scheme).
* **Costs.** Group ``g`` with batch fraction ``f_g`` and ``M`` micro-batches: stage ``s`` on device
  ``d`` costs ``sum_{v in s} forward_ms(v, kind_d) / capacity_d * f_g / M`` per micro-batch
  (backward alike); a piece rank's backward is the same sum over its piece's nodes, and the stage
  rank's last backward is its piece 0; activations ``hop_bytes * f_g / M`` per micro-batch and hop.
  Bucket ``b`` is a ring all-reduce of ``b.nbytes`` over its ranks' devices.
* **Batch split** (:func:`tf_commopt.core.hybrid.batch_fractions`): ``t_g`` = the group's GPipe
  pipeline alone on the whole mini-batch, simulated without all-reduce.
* **Data parallel** (:func:`simulate_dp`): ``split="equal"`` (the thesis's SSGD) or
  ``"proportional"`` (share ``speed_d / sum speed``); without overlap one all-reduce of all parameters
  after the backward (:func:`tf_commopt.core.simulate.simulate_data_parallel`); with ``overlap=True``
  it is the hybrid program of ``N`` one-device groups with those shares: the same buckets and
  overlap as the hybrid, so comparisons are like for like.
* **Search** (:func:`search_grouped_hybrid`): every group count ``G``, grouping rule, micro-batch count
  and (per group) partition method; ``G = N`` is proportional data parallel, so the best is never
  slower than it.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple, Union

from tf_commopt.core.costgraph import CostGraph
from tf_commopt.core.devices import Cluster
from tf_commopt.core.hybrid import (
    DEFAULT_BUCKET_BYTES, GROUPINGS, HybridProgram, batch_fractions, check_groups, contiguous_groups,
    hybrid_program, snake_groups,
)
from tf_commopt.core.partition.plan import PartitionPlan
from tf_commopt.core.schedule import gpipe
from tf_commopt.core.simulate.dataparallel import simulate_data_parallel
from tf_commopt.core.simulate.engine import Job, RankCost
from tf_commopt.core.simulate.pipeline import hop_bytes, stage_costs
from tf_commopt.core.simulate.result import SimResult, simulate_job
from tf_commopt.errors import InputError, PlanError

__all__ = ["device_speeds", "ideal_iteration_ms", "simulate_dp", "snake_groups", "contiguous_groups",
           "GROUPINGS", "sub_cluster", "group_plans", "group_alone_ms", "grouped_hybrid_job",
           "simulate_grouped_hybrid", "search_grouped_hybrid", "as_cluster", "single_stage_plan"]

ClusterLike = Union[Cluster, Sequence[float]]


def as_cluster(cluster: ClusterLike, bandwidth_gbps: float = 10.0, latency_ms: float = 0.0,
               kinds: Optional[Sequence[Optional[str]]] = None) -> Cluster:
    """``cluster`` itself, or ``Cluster.from_capacities(cluster, bandwidth_gbps, latency_ms, kinds)``."""
    if isinstance(cluster, Cluster):
        return cluster
    return Cluster.from_capacities(list(cluster), bandwidth_gbps, latency_ms, kinds=kinds)


def device_speeds(graph: CostGraph, cluster: Cluster) -> List[float]:
    """Profiled mini-batches per ms of each device: ``capacity / graph.total_ms(kind)``."""
    out = []
    for d in cluster.devices:
        t = graph.total_ms(d.kind)
        if not t > 0:
            raise InputError(f"graph {graph.name!r} has no compute time for kind {d.kind!r}", where=f"device {d.name!r}")
        out.append(d.capacity / t)
    return out


def ideal_iteration_ms(graph: CostGraph, cluster: ClusterLike) -> float:
    """The capacity-proportional ideal ``1 / sum_d speed_d`` (no communication, no bubble)."""
    return 1.0 / sum(device_speeds(graph, as_cluster(cluster)))


def simulate_dp(graph: CostGraph, cluster: ClusterLike, split: str = "equal", microbatches: int = 1,
                optimizer_ms: float = 0.0, overlap: bool = False,
                bucket_bytes: Optional[float] = DEFAULT_BUCKET_BYTES) -> SimResult:
    """Synchronous data parallelism with an ``"equal"`` or speed-``"proportional"`` batch split;
    ``overlap=True``: bucketed all-reduces overlapping the backward (the hybrid's rules, ``G = N``)."""
    cl = as_cluster(cluster)
    if split == "equal":
        fr = None
    elif split == "proportional":
        sp = device_speeds(graph, cl)
        fr = [s / sum(sp) for s in sp]
    else:
        raise InputError(f"split must be 'equal' or 'proportional', got {split!r}", where="split")
    if overlap:
        n = len(cl)
        res = simulate_grouped_hybrid(graph, cl, [[i] for i in range(n)], microbatches,
                                      plans=[single_stage_plan(graph)] * n, batch_fractions=fr or [1.0 / n] * n,
                                      optimizer_ms=optimizer_ms, overlap=True, bucket_bytes=bucket_bytes)
    else:
        res = simulate_data_parallel(graph, cl, microbatches, fr, optimizer_ms)
    res.extra.update({"split": split, "overlap": overlap, "batch_fractions": fr or [1.0 / len(cl)] * len(cl)})
    return res


def single_stage_plan(graph: CostGraph) -> PartitionPlan:
    """The whole graph as one stage on the group's only device."""
    t = graph.total_ms()
    return PartitionPlan("single", {v: 0 for v in graph.topological_order()}, [0], [t], [0.0], [0.0], t, 0.0,
                         graph_name=graph.name)


def sub_cluster(cluster: Cluster, group: Sequence[int]) -> Cluster:
    """The devices ``group`` of ``cluster`` (renumbered 0..len-1) with their links."""
    pos = {d: k for k, d in enumerate(group)}
    links = {(pos[a], pos[b]): lk for (a, b), lk in cluster.links.items() if a in pos and b in pos}
    return Cluster([cluster.devices[i] for i in group], cluster.default_link, links)


def _group_job(graph: CostGraph, cluster: Cluster, group: Sequence[int], plan: PartitionPlan,
               microbatches: int, fraction: float, optimizer_ms: float, offset: int = 0
               ) -> Tuple[List[RankCost], Dict[Tuple[str, int, int], float]]:
    """Rank costs and messages of one group's pipeline (stage ranks only) on ``fraction`` of the batch."""
    k = plan.num_stages
    if k != len(group) or sorted(plan.device_of_stage) != list(range(k)):
        raise PlanError(f"a group of {len(group)} devices needs a plan using each of them once, got "
                        f"device_of_stage={plan.device_of_stage}", where=f"plan {plan.method!r}")
    scale = fraction / microbatches
    costs = stage_costs(graph, plan, sub_cluster(cluster, group))
    ranks = [RankCost(group[plan.device_of_stage[s]], f * scale, b * scale, optimizer_ms)
             for s, (f, b) in enumerate(costs)]
    msgs: Dict[Tuple[str, int, int], float] = {}
    for h, nbytes in enumerate(hop_bytes(graph, plan.stage_of_node, k)):
        msgs[("act", offset + h, offset + h + 1)] = nbytes * scale
        msgs[("grad", offset + h + 1, offset + h)] = nbytes * scale
    return ranks, msgs


def group_alone_ms(graph: CostGraph, cluster: Cluster, group: Sequence[int], plan: PartitionPlan,
                   microbatches: int, optimizer_ms: float = 0.0) -> float:
    """``t_g``: the group's GPipe pipeline alone on the whole mini-batch (no all-reduce), simulated."""
    ranks, msgs = _group_job(graph, cluster, group, plan, microbatches, 1.0, optimizer_ms)
    job = Job(gpipe(plan.num_stages, microbatches), ranks, cluster, msgs, {}, split=microbatches)
    return simulate_job(job).iteration_ms


def group_plans(graph: CostGraph, cluster: Cluster, groups: Sequence[Sequence[int]],
                method: Union[str, Sequence[str]] = "pipedream", microbatches: int = 4, seed: int = 0,
                cache: Optional[Dict] = None) -> List[PartitionPlan]:
    """One capacity-aware plan per group (``device_of_stage`` indexes the group's devices).

    With several methods, each group keeps the plan whose pipeline alone simulates fastest. ``cache``
    (a dict) reuses plans between groups of the same devices (capacity, kind, links).
    """
    from tf_commopt.core.partition.api import partition  # lazy: partition.simrank imports the simulator

    methods = [method] if isinstance(method, str) else list(method)
    if not methods:
        raise InputError("no partition method given", where="method")
    out = []
    for group in groups:
        if len(group) == 1:
            out.append(single_stage_plan(graph))
            continue
        sub = sub_cluster(cluster, group)
        key = (tuple((d.capacity, d.kind, d.memory_bytes) for d in sub.devices), sub.default_link,
               tuple(sorted(sub.links.items())), tuple(methods), microbatches, seed, id(graph))
        if cache is not None and key in cache:
            out.append(cache[key])
            continue
        best, best_ms = None, float("inf")
        for m in methods:
            plan = partition(graph, len(group), method=m, cluster=sub, seed=seed)
            ms = group_alone_ms(graph, cluster, group, plan, microbatches) if len(methods) > 1 else 0.0
            if best is None or ms < best_ms:
                best, best_ms = plan, ms
        if cache is not None:
            cache[key] = best
        out.append(best)
    return out


def grouped_hybrid_job(graph: CostGraph, cluster: Cluster, groups: Sequence[Sequence[int]],
                       plans: Sequence[PartitionPlan], microbatches: int = 4,
                       batch_fractions: Optional[Sequence[float]] = None, optimizer_ms: float = 0.0,
                       overlap: bool = True, bucket_bytes: Optional[float] = DEFAULT_BUCKET_BYTES
                       ) -> Tuple[Job, List[float], HybridProgram]:
    """The hybrid program (:func:`tf_commopt.core.hybrid.hybrid_program`) bound to costs; also the batch
    fractions and the program."""
    gs = check_groups(groups, len(cluster))
    if len(plans) != len(gs):
        raise InputError(f"{len(plans)} plans for {len(gs)} groups", where="plans")
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise InputError(f"microbatches must be a positive integer, got {microbatches!r}", where="microbatches")
    G = len(gs)
    if batch_fractions is None:
        fr = _fractions(graph, cluster, gs, plans, microbatches, optimizer_ms)
    else:
        fr = [float(f) for f in batch_fractions]
        if len(fr) != G or any(not f > 0 for f in fr):
            raise InputError(f"batch_fractions must be {G} positive numbers, got {list(batch_fractions)}",
                             where="batch_fractions")
    order = graph.topological_order()
    prog = hybrid_program(order, {v: graph[v].param_bytes for v in order}, [p.stage_of_node for p in plans],
                          microbatches, overlap, bucket_bytes, [p.num_stages for p in plans])
    ranks: List[RankCost] = []
    msgs: Dict[Tuple[str, int, int], float] = {}
    for g, (group, plan) in enumerate(zip(gs, plans)):
        rk, ms = _group_job(graph, cluster, group, plan, microbatches, fr[g], optimizer_ms, len(ranks))
        ranks += rk
        msgs.update(ms)
    if overlap:
        sched = prog.schedule
        last_mb = {}
        for r, role in enumerate(prog.roles):
            g, s = role.group, role.stage
            dev = cluster.devices[ranks[prog.stage_rank[g][s]].device]
            piece_ms = sum(graph.backward_ms(v, dev.kind) for v in role.nodes) / dev.capacity * fr[g] / microbatches
            if role.piece == 0:
                st = sched.streams[r]
                last_mb[r] = [i for i in st if type(i).__name__ == "Backward"][-1].mb
                base = ranks[r]
                ranks[r] = RankCost(base.device, base.forward_ms, base.backward_ms, optimizer_ms,
                                    backward_mb={last_mb[r]: piece_ms})
            else:
                ranks.append(RankCost(ranks[prog.stage_rank[g][s]].device, 0.0, piece_ms, 0.0))
        for r, role in enumerate(prog.roles):  # the last piece sends the gradients to the previous stage
            if role.piece > 0 and role.stage > 0:
                prev, main = prog.stage_rank[role.group][role.stage - 1], prog.stage_rank[role.group][role.stage]
                if any(type(i).__name__ == "SendGrad" and i.peer == prev for i in sched.streams[r]):
                    msgs[("grad", r, prev)] = msgs.get(("grad", main, prev), 0.0)
    coll = {b.key: b.nbytes for b in prog.buckets}
    return Job(prog.schedule, ranks, cluster, msgs, coll, split=microbatches), fr, prog


def _fractions(graph: CostGraph, cluster: Cluster, groups: Sequence[Sequence[int]],
               plans: Sequence[PartitionPlan], microbatches: int, optimizer_ms: float = 0.0) -> List[float]:
    return batch_fractions([group_alone_ms(graph, cluster, g, p, microbatches, optimizer_ms)
                            for g, p in zip(groups, plans)])


def simulate_grouped_hybrid(graph: CostGraph, cluster: ClusterLike, groups: Sequence[Sequence[int]],
                            microbatches: int = 4, plans: Optional[Sequence[PartitionPlan]] = None,
                            method: Union[str, Sequence[str]] = "pipedream",
                            batch_fractions: Optional[Sequence[float]] = None, seed: int = 0,
                            optimizer_ms: float = 0.0, bandwidth_gbps: float = 10.0, latency_ms: float = 0.0,
                            kinds: Optional[Sequence[Optional[str]]] = None,
                            cache: Optional[Dict] = None, overlap: bool = True,
                            bucket_bytes: Optional[float] = DEFAULT_BUCKET_BYTES) -> SimResult:
    """One grouped hybrid iteration (see module docstring).

    Args:
        graph: the profile (times and bytes per profiled mini-batch).
        cluster: a Cluster, or capacities (with ``bandwidth_gbps``, ``latency_ms``, ``kinds``).
        groups: lists of device indices, one pipeline each.
        microbatches: GPipe micro-batches per group per mini-batch.
        plans: one plan per group (``device_of_stage`` indexing the group's devices); default from
            :func:`group_plans` with ``method`` and ``seed``.
        batch_fractions: share of the mini-batch per group (default: throughput-proportional).
        optimizer_ms: cost of each ``OptimizerStep``.
        overlap, bucket_bytes: see :func:`tf_commopt.core.hybrid.hybrid_program`.

    Returns:
        SimResult; ``extra`` has ``groups``, ``batch_fractions``, ``stage_layers``, ``plan_methods``,
        ``allreduce_chunks`` (buckets), ``allreduce_bytes``, ``overlap``.
    """
    cl = as_cluster(cluster, bandwidth_gbps, latency_ms, kinds)
    gs = check_groups(groups, len(cl))
    if plans is None:
        plans = group_plans(graph, cl, gs, method, microbatches, seed, cache)
    job, fr, prog = grouped_hybrid_job(graph, cl, gs, plans, microbatches, batch_fractions, optimizer_ms,
                                       overlap, bucket_bytes)
    res = simulate_job(job)
    res.extra.update({
        "groups": gs, "batch_fractions": fr, "microbatches": microbatches, "overlap": overlap,
        "stage_layers": [[len(p.nodes_of_stage(s)) for s in range(p.num_stages)] for p in plans],
        "plan_methods": [p.method for p in plans], "allreduce_chunks": len(prog.buckets),
        "allreduce_bytes": sum(b.nbytes for b in prog.buckets),
    })
    return res


def search_grouped_hybrid(graph: CostGraph, cluster: ClusterLike, group_counts: Optional[Sequence[int]] = None,
                          groupings: Sequence[str] = ("snake", "contiguous"),
                          microbatches: Union[int, Sequence[int]] = 4,
                          method: Union[str, Sequence[str]] = "pipedream", seed: int = 0,
                          optimizer_ms: float = 0.0, cache: Optional[Dict] = None, overlap: bool = True,
                          bucket_bytes: Optional[float] = DEFAULT_BUCKET_BYTES) -> SimResult:
    """The fastest simulated grouped hybrid over ``group_counts`` (default 1..N), ``groupings``,
    ``microbatches`` (one or several counts) and the plans of ``method`` (see :func:`group_plans`).

    ``extra["candidates"]`` lists every ``{"num_groups", "grouping", "groups", "microbatches",
    "iteration_ms"}`` tried. ``G = N`` (one-device groups) is capacity-proportional data parallel with
    the same overlap, so the result is never slower than ``simulate_dp(..., "proportional", overlap=...)``
    with the same bucket size and micro-batches among those tried.
    """
    cl = as_cluster(cluster)
    n = len(cl)
    counts = list(range(1, n + 1)) if group_counts is None else list(group_counts)
    for gname in groupings:
        if gname not in GROUPINGS:
            raise InputError(f"unknown grouping {gname!r}; choose from {sorted(GROUPINGS)}", where="groupings")
    ms_list = [microbatches] if isinstance(microbatches, int) else list(microbatches)
    speeds = device_speeds(graph, cl)
    cache = {} if cache is None else cache
    best: Optional[SimResult] = None
    cands, seen = [], set()
    for G in counts:
        for gname in groupings:
            groups = GROUPINGS[gname](speeds, G)
            for m in ms_list:
                m = m if G < n else 1  # one-device groups: data parallel, no micro-batches
                key = (tuple(map(tuple, groups)), m)
                if key in seen:
                    continue
                seen.add(key)
                r = simulate_grouped_hybrid(graph, cl, groups, m, method=method, seed=seed,
                                            optimizer_ms=optimizer_ms, cache=cache, overlap=overlap,
                                            bucket_bytes=bucket_bytes)
                cands.append({"num_groups": G, "grouping": gname, "groups": groups, "microbatches": m,
                              "iteration_ms": r.iteration_ms})
                if best is None or r.iteration_ms < best.iteration_ms:
                    best = r
                    best.extra["grouping"] = gname
    assert best is not None
    best.extra["candidates"] = cands
    return best
