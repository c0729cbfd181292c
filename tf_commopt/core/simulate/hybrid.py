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

The device-aware grouped hybrid strategy of thesis 000 (after HetPipe, Park et al., USENIX ATC 2020;
GPipe, Huang et al., NeurIPS 2019), the same rules as :mod:`tf_commopt.distribute.hybrid`, bound to
the simulator's engine (:mod:`tf_commopt.core.simulate.engine`). The exact rules:

* **Speed.** Device ``d`` processes ``speed_d = capacity_d / graph.total_ms(kind_d)`` profiled
  mini-batches per ms (capacity and per-layer kind costs both count).
* **Capacity-proportional ideal.** ``1 / sum_d speed_d`` ms per profiled mini-batch: the whole cluster's
  compute perfectly shared, no communication, no bubble (a lower bound for any synchronous scheme).
* **Data parallel** (:func:`simulate_dp`): every device holds the whole model; ``split="equal"``
  gives each device ``1/N`` of the mini-batch (the thesis's SSGD: the slowest device is the
  straggler); ``split="proportional"`` gives device ``d`` the share ``speed_d / sum speed``; then a
  ring all-reduce of all parameters (:func:`tf_commopt.core.simulate.simulate_data_parallel`).
* **Grouped hybrid** (:func:`simulate_grouped_hybrid`): group ``g`` (device indices) runs a
  GPipe pipeline of ``P_g = len(group)`` stages from the capacity-aware partitioner
  (:func:`tf_commopt.core.partition.api.partition` on the group's sub-cluster; with several methods
  the plan whose group pipeline simulates fastest) on the fraction ``f_g`` of the mini-batch, split
  into ``M`` micro-batches (stage costs and activation bytes scale by ``f_g / M``). Default ``f_g`` is
  proportional to the group's throughput ``1 / t_g`` (``t_g``: its pipeline alone on the whole
  mini-batch, simulated), as the real strategy splits the batch in proportion to throughput.
  Gradients: the layers are cut into *chunks* of equal stage tuple ``(stage in group 0, stage in
  group 1, ...)``; each chunk with parameters is one ring all-reduce of its parameter bytes among the
  ``G`` ranks that hold it, issued by every rank after its last backward in increasing tuple order
  (a global order, so no deadlock); with identical plans the chunks are the stages (one all-reduce
  per stage, overlapping other stages' backwards). Then ``OptimizerStep``. The streams are
  ``combine([gpipe(P_g, M, optimizer_step=False) ...], tails)``.
* **Group formation** (:func:`search_grouped_hybrid`): for each group count ``G`` and grouping rule
  (``snake``: devices sorted by speed dealt 0..G-1, G-1..0, .. as
  :func:`tf_commopt.distribute.hybrid.form_groups`; ``contiguous``: speed-sorted blocks of equal size,
  similar devices together), simulate, keep the fastest.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple, Union

from tf_commopt.core.costgraph import CostGraph
from tf_commopt.core.devices import Cluster
from tf_commopt.core.partition.api import partition
from tf_commopt.core.partition.plan import PartitionPlan
from tf_commopt.core.schedule import AllReduce, OptimizerStep, combine, gpipe
from tf_commopt.core.simulate.dataparallel import simulate_data_parallel
from tf_commopt.core.simulate.engine import Job, RankCost
from tf_commopt.core.simulate.pipeline import hop_bytes, stage_costs
from tf_commopt.core.simulate.result import SimResult, simulate_job
from tf_commopt.errors import InputError, PlanError

__all__ = ["device_speeds", "ideal_iteration_ms", "simulate_dp", "snake_groups", "contiguous_groups",
           "sub_cluster", "group_plans", "grouped_hybrid_job", "simulate_grouped_hybrid",
           "search_grouped_hybrid", "as_cluster"]

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
                optimizer_ms: float = 0.0) -> SimResult:
    """Synchronous data parallelism with an ``"equal"`` or speed-``"proportional"`` batch split."""
    cl = as_cluster(cluster)
    if split == "equal":
        fr = None
    elif split == "proportional":
        sp = device_speeds(graph, cl)
        fr = [s / sum(sp) for s in sp]
    else:
        raise InputError(f"split must be 'equal' or 'proportional', got {split!r}", where="split")
    res = simulate_data_parallel(graph, cl, microbatches, fr, optimizer_ms)
    res.extra.update({"split": split, "batch_fractions": fr or [1.0 / len(cl)] * len(cl)})
    return res


def _check_groups_count(n: int, num_groups: int) -> None:
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or not 1 <= num_groups <= n:
        raise InputError(f"num_groups must be an integer in 1..{n} (the number of devices), got {num_groups!r}",
                         where="num_groups")


def snake_groups(speeds: Sequence[float], num_groups: int) -> List[List[int]]:
    """Devices sorted by speed (descending, ties by index) dealt in snake order; each group sorted.

    >>> snake_groups([1, 1, 1, 0.5], 2)
    [[0, 3], [1, 2]]
    """
    n = len(speeds)
    _check_groups_count(n, num_groups)
    order = sorted(range(n), key=lambda i: (-float(speeds[i]), i))
    groups: List[List[int]] = [[] for _ in range(num_groups)]
    for k, dev in enumerate(order):
        lap, pos = divmod(k, num_groups)
        groups[pos if lap % 2 == 0 else num_groups - 1 - pos].append(dev)
    return [sorted(g) for g in groups]


def contiguous_groups(speeds: Sequence[float], num_groups: int) -> List[List[int]]:
    """Speed-sorted devices cut into ``num_groups`` consecutive blocks (sizes differ by at most one).

    >>> contiguous_groups([0.25, 1, 0.5, 1], 2)
    [[1, 3], [0, 2]]
    """
    n = len(speeds)
    _check_groups_count(n, num_groups)
    order = sorted(range(n), key=lambda i: (-float(speeds[i]), i))
    q, r = divmod(n, num_groups)
    out, k = [], 0
    for g in range(num_groups):
        size = q + (1 if g < r else 0)
        out.append(sorted(order[k:k + size]))
        k += size
    return out


GROUPINGS = {"snake": snake_groups, "contiguous": contiguous_groups}


def _check_groups(groups: Sequence[Sequence[int]], n: int) -> List[List[int]]:
    gs = [[int(i) for i in g] for g in groups]
    flat = [i for g in gs for i in g]
    if not gs or any(not g for g in gs) or len(flat) != len(set(flat)) or any(not 0 <= i < n for i in flat):
        raise InputError(f"groups must be non-empty, disjoint lists of device indices in 0..{n - 1}, got "
                         f"{[list(g) for g in groups]!r}", where="groups")
    return gs


def sub_cluster(cluster: Cluster, group: Sequence[int]) -> Cluster:
    """The devices ``group`` of ``cluster`` (renumbered 0..len-1) with their links."""
    pos = {d: k for k, d in enumerate(group)}
    links = {(pos[a], pos[b]): lk for (a, b), lk in cluster.links.items() if a in pos and b in pos}
    return Cluster([cluster.devices[i] for i in group], cluster.default_link, links)


def _group_job(graph: CostGraph, cluster: Cluster, group: Sequence[int], plan: PartitionPlan,
               microbatches: int, fraction: float, optimizer_ms: float, offset: int = 0
               ) -> Tuple[List[RankCost], Dict[Tuple[str, int, int], float]]:
    """Rank costs and messages of one group's pipeline on ``fraction`` of the mini-batch."""
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


def _group_alone_ms(graph: CostGraph, cluster: Cluster, group: Sequence[int], plan: PartitionPlan,
                    microbatches: int, optimizer_ms: float = 0.0) -> float:
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
    methods = [method] if isinstance(method, str) else list(method)
    if not methods:
        raise InputError("no partition method given", where="method")
    out = []
    for group in groups:
        sub = sub_cluster(cluster, group)
        key = (tuple((d.capacity, d.kind, d.memory_bytes) for d in sub.devices), sub.default_link,
               tuple(sorted(sub.links.items())), tuple(methods), microbatches, seed, id(graph))
        if cache is not None and key in cache:
            out.append(cache[key])
            continue
        best, best_ms = None, float("inf")
        for m in methods:
            plan = partition(graph, len(group), method=m, cluster=sub, seed=seed)
            ms = _group_alone_ms(graph, cluster, group, plan, microbatches) if len(methods) > 1 else 0.0
            if best is None or ms < best_ms:
                best, best_ms = plan, ms
        if cache is not None:
            cache[key] = best
        out.append(best)
    return out


def grouped_hybrid_job(graph: CostGraph, cluster: Cluster, groups: Sequence[Sequence[int]],
                       plans: Sequence[PartitionPlan], microbatches: int = 4,
                       batch_fractions: Optional[Sequence[float]] = None, optimizer_ms: float = 0.0
                       ) -> Tuple[Job, List[float], List[Tuple[Tuple[int, ...], float]]]:
    """The combined job (see module docstring); also the batch fractions and the all-reduce chunks
    ``(stage tuple, parameter bytes)``."""
    gs = _check_groups(groups, len(cluster))
    if len(plans) != len(gs):
        raise InputError(f"{len(plans)} plans for {len(gs)} groups", where="plans")
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise InputError(f"microbatches must be a positive integer, got {microbatches!r}", where="microbatches")
    G = len(gs)
    if batch_fractions is None:
        inv = [1.0 / _group_alone_ms(graph, cluster, g, p, microbatches, optimizer_ms) for g, p in zip(gs, plans)]
        fr = [w / sum(inv) for w in inv]
    else:
        fr = [float(f) for f in batch_fractions]
        if len(fr) != G or any(not f > 0 for f in fr):
            raise InputError(f"batch_fractions must be {G} positive numbers, got {list(batch_fractions)}",
                             where="batch_fractions")
    ranks: List[RankCost] = []
    msgs: Dict[Tuple[str, int, int], float] = {}
    offsets = []
    for g, (group, plan) in enumerate(zip(gs, plans)):
        offsets.append(len(ranks))
        rk, ms = _group_job(graph, cluster, group, plan, microbatches, fr[g], optimizer_ms, offsets[-1])
        ranks += rk
        msgs.update(ms)
    # all-reduce chunks: nodes with the same stage in every group, in a global (lexicographic) order
    chunk_bytes: Dict[Tuple[int, ...], float] = {}
    for v in graph.topological_order():
        key = tuple(p.stage_of_node[v] for p in plans)
        chunk_bytes[key] = chunk_bytes.get(key, 0.0) + graph[v].param_bytes
    chunks = sorted((k, b) for k, b in chunk_bytes.items() if b > 0)
    tails: List[List] = [[] for _ in ranks]
    coll: Dict[str, float] = {}
    if G > 1:
        for c, (key, nbytes) in enumerate(chunks):
            members = tuple(offsets[g] + s for g, s in enumerate(key))
            coll[f"grads{c}"] = nbytes
            for r in members:
                tails[r].append(AllReduce(f"grads{c}", members))
    for t in tails:
        t.append(OptimizerStep())
    sched = combine("grouped_hybrid", [gpipe(p.num_stages, microbatches, optimizer_step=False) for p in plans], tails)
    return Job(sched, ranks, cluster, msgs, coll, split=microbatches), fr, chunks


def simulate_grouped_hybrid(graph: CostGraph, cluster: ClusterLike, groups: Sequence[Sequence[int]],
                            microbatches: int = 4, plans: Optional[Sequence[PartitionPlan]] = None,
                            method: Union[str, Sequence[str]] = "pipedream",
                            batch_fractions: Optional[Sequence[float]] = None, seed: int = 0,
                            optimizer_ms: float = 0.0, bandwidth_gbps: float = 10.0, latency_ms: float = 0.0,
                            kinds: Optional[Sequence[Optional[str]]] = None,
                            cache: Optional[Dict] = None) -> SimResult:
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

    Returns:
        SimResult; ``extra`` has ``groups``, ``batch_fractions``, ``stage_layers``, ``plan_methods``,
        ``allreduce_chunks``, ``allreduce_bytes``.
    """
    cl = as_cluster(cluster, bandwidth_gbps, latency_ms, kinds)
    gs = _check_groups(groups, len(cl))
    if plans is None:
        plans = group_plans(graph, cl, gs, method, microbatches, seed, cache)
    job, fr, chunks = grouped_hybrid_job(graph, cl, gs, plans, microbatches, batch_fractions, optimizer_ms)
    res = simulate_job(job)
    res.extra.update({
        "groups": gs, "batch_fractions": fr, "microbatches": microbatches,
        "stage_layers": [[len(p.nodes_of_stage(s)) for s in range(p.num_stages)] for p in plans],
        "plan_methods": [p.method for p in plans], "allreduce_chunks": len(chunks) if len(gs) > 1 else 0,
        "allreduce_bytes": sum(b for _, b in chunks) if len(gs) > 1 else 0.0,
    })
    return res


def search_grouped_hybrid(graph: CostGraph, cluster: ClusterLike, group_counts: Optional[Sequence[int]] = None,
                          groupings: Sequence[str] = ("snake", "contiguous"), microbatches: int = 4,
                          method: Union[str, Sequence[str]] = "pipedream", seed: int = 0,
                          optimizer_ms: float = 0.0, cache: Optional[Dict] = None) -> SimResult:
    """The fastest simulated grouped hybrid over ``group_counts`` (default 1..N) and ``groupings``.

    ``extra["candidates"]`` lists every ``{"num_groups", "grouping", "groups", "iteration_ms"}`` tried.
    """
    cl = as_cluster(cluster)
    n = len(cl)
    counts = list(range(1, n + 1)) if group_counts is None else list(group_counts)
    for gname in groupings:
        if gname not in GROUPINGS:
            raise InputError(f"unknown grouping {gname!r}; choose from {sorted(GROUPINGS)}", where="groupings")
    speeds = device_speeds(graph, cl)
    cache = {} if cache is None else cache
    best: Optional[SimResult] = None
    cands, seen = [], set()
    for G in counts:
        for gname in groupings:
            groups = GROUPINGS[gname](speeds, G)
            key = tuple(map(tuple, groups))
            if key in seen:
                continue
            seen.add(key)
            r = simulate_grouped_hybrid(graph, cl, groups, microbatches, method=method, seed=seed,
                                        optimizer_ms=optimizer_ms, cache=cache)
            cands.append({"num_groups": G, "grouping": gname, "groups": groups, "iteration_ms": r.iteration_ms})
            if best is None or r.iteration_ms < best.iteration_ms:
                best = r
                best.extra["grouping"] = gname
    assert best is not None
    best.extra["candidates"] = cands
    return best
