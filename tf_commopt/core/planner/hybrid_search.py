"""The fastest simulated grouped hybrid over group counts, groupings, micro-batches and plans.

Example:
    >>> from tf_commopt.core.costgraph import CostGraph, Node
    >>> from tf_commopt.core.devices import Cluster
    >>> from tf_commopt.core.planner.hybrid_search import search_grouped_hybrid
    >>> g = CostGraph([Node(f"l{i}", 1.0, 2.0, param_bytes=1e6) for i in range(6)],
    ...               [(f"l{i}", f"l{i+1}") for i in range(5)])
    >>> best = search_grouped_hybrid(g, Cluster.from_capacities([1, 1, 0.5]), method="balanced")
    >>> best.result.iteration_ms <= min(c["iteration_ms"] for c in best.candidates)
    True

Every group count ``G`` (default 1..N), grouping rule (:mod:`groups`) and micro-batch count, with the
groups' plans of :func:`hybrid.plan_hybrid`; with ``replicated`` (replica shapes of
:func:`groups.replica_sets`) also one pipeline of ``P = 2..N-1`` replicated stages per shape and
method (:func:`hybrid.replicated_plan`). ``G = N`` (one-device groups) is capacity-proportional data
parallelism with the same overlap, so the result is never slower than
``simulate_dp(..., "proportional", overlap=...)`` with the same bucket size.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence, Union

from tf_commopt.core.costgraph import CostGraph
from tf_commopt.core.plan import HybridPlan
from tf_commopt.core.planner.groups import GROUPINGS, REPLICA_SHAPES, replica_sets
from tf_commopt.core.planner.hybrid import Methods, method_list, plan_hybrid, replicated_plan
from tf_commopt.core.schedule.buckets import DEFAULT_BUCKET_BYTES
from tf_commopt.core.simulate.hybrid import ClusterLike, as_cluster, device_speeds, simulate_grouped_hybrid
from tf_commopt.core.simulate.result import SimResult
from tf_commopt.errors import InputError

__all__ = ["HybridChoice", "search_grouped_hybrid"]


@dataclass
class HybridChoice:
    """The search's result: the best ``plan``, its simulated ``result``, and every candidate tried
    (``{"num_groups", "grouping", "groups", "microbatches", "iteration_ms"}``, plus ``"stage_devices"``
    for replicated ones)."""

    plan: HybridPlan
    result: SimResult
    candidates: List[Dict]


def _check(groupings: Sequence[str], replicated: Sequence[str]) -> None:
    for gname in groupings:
        if gname not in GROUPINGS:
            raise InputError(
                f"unknown grouping {gname!r}; choose from {sorted(GROUPINGS)}", where="groupings"
            )
    for shape in replicated:
        if shape not in REPLICA_SHAPES:
            raise InputError(
                f"unknown replica shape {shape!r}; choose from {list(REPLICA_SHAPES)}", where="replicated"
            )


def search_grouped_hybrid(
    graph: CostGraph,
    cluster: ClusterLike,
    group_counts: Optional[Sequence[int]] = None,
    groupings: Sequence[str] = ("snake", "contiguous"),
    microbatches: Union[int, Sequence[int]] = 4,
    method: Methods = "ga",
    seed: int = 0,
    optimizer_ms: float = 0.0,
    cache: Optional[Dict] = None,
    overlap: bool = True,
    bucket_bytes: Optional[float] = DEFAULT_BUCKET_BYTES,
    replicated: Sequence[str] = (),
) -> HybridChoice:
    """The fastest simulated grouped hybrid (see the module docstring); arguments as
    :func:`hybrid.plan_hybrid` and :func:`tf_commopt.core.simulate.hybrid.simulate_grouped_hybrid`."""
    cl = as_cluster(cluster)
    n = len(cl)
    _check(groupings, replicated)
    counts = list(range(1, n + 1)) if group_counts is None else list(group_counts)
    ms_list = [microbatches] if isinstance(microbatches, int) else list(microbatches)
    speeds = device_speeds(graph, cl)
    cache = {} if cache is None else cache
    tried: List = []  # (plan, result, candidate)
    seen = set()
    for G in counts:
        for gname in groupings:
            groups = GROUPINGS[gname](speeds, G)
            for m in ms_list:
                m = m if G < n else 1  # one-device groups: data parallel, no micro-batches
                if (tuple(map(tuple, groups)), m) in seen:
                    continue
                seen.add((tuple(map(tuple, groups)), m))
                hp = plan_hybrid(graph, cl, groups, microbatches=m, method=method, seed=seed,
                                 optimizer_ms=optimizer_ms, cache=cache)  # fmt: skip
                hp = replace(hp, grouping=gname)
                r = simulate_grouped_hybrid(graph, cl, hp, optimizer_ms, overlap, bucket_bytes)
                tried.append(
                    (hp, r, {"num_groups": G, "grouping": gname, "groups": groups, "microbatches": m})
                )
    for P in range(2, n):
        for shape in replicated:
            sets = replica_sets(speeds, P, shape)
            for meth in method_list(method):
                if ("rep", tuple(map(tuple, sets)), meth) in seen:
                    continue
                seen.add(("rep", tuple(map(tuple, sets)), meth))
                for m in ms_list:
                    hp = replicated_plan(graph, cl, sets, m, meth, seed, shape, optimizer_ms)
                    r = simulate_grouped_hybrid(graph, cl, hp, optimizer_ms, overlap, bucket_bytes)
                    cand = {"num_groups": 1, "grouping": hp.grouping, "groups": [list(range(n))],
                            "stage_devices": [list(d) for d in hp.stage_devices[0]], "microbatches": m}  # fmt: skip
                    tried.append((hp, r, cand))
    cands = []
    for _, r, cand in tried:
        cand["iteration_ms"] = r.iteration_ms
        cands.append(cand)
    best = min(range(len(tried)), key=lambda i: (tried[i][1].iteration_ms, i))
    return HybridChoice(tried[best][0], tried[best][1], cands)
