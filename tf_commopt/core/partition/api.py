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
* ``pipedream``: PipeDream's DP with overlapped communication.
* ``local``: graph local search (:mod:`local_search`) started from the balanced and PipeDream plans.
* ``ga``: the DEAP memetic GA (:mod:`genetic`) seeded with all of the above plus the exact contiguous
  optimum of our objective over two topological orders (Kahn's and depth-first).

``score="simulated"`` (``local`` and ``ga`` only; the baselines ignore it): the search is unchanged, but
the returned plan is the candidate (every seed, every local-search result, the GA's final population)
with the best simulated ``schedule`` time (:mod:`simrank`), so never worse in simulation than the
``layerwise``, ``balanced`` and ``pipedream`` plans.

Device placement: the plan uses the ``num_stages`` fastest devices. ``balanced``, ``pipedream`` and the
seeds of ``local``/``ga`` try the given device order, fastest-first and slowest-first (heterogeneous
clusters only) and keep the best under the objective; ``local`` and ``ga`` then also swap devices.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from tf_commopt.core.costgraph import CostGraph
from tf_commopt.core.devices import Cluster
from tf_commopt.core.partition import baselines
from tf_commopt.core.partition.convexity import dfs_topological_order
from tf_commopt.core.partition.genetic import genetic
from tf_commopt.core.partition.local_search import local_search
from tf_commopt.core.partition.objective import Problem
from tf_commopt.core.partition.plan import PartitionPlan
from tf_commopt.core.partition.simrank import best_simulated, check_score, default_microbatches
from tf_commopt.errors import InputError

__all__ = ["partition", "evaluate", "make_cluster", "METHODS"]

METHODS = ("layerwise", "balanced", "pipedream", "local", "ga")
Plan = Tuple[List[int], List[int]]


def make_cluster(num_stages: int, capacities: Optional[Sequence[float]] = None, bandwidth_gbps: float = 10.0,
                 latency_ms: float = 0.0, kinds: Union[None, str, Sequence[Optional[str]]] = None,
                 cluster: Optional[Cluster] = None) -> Cluster:
    """The cluster a call describes: ``cluster`` as given, else one device per capacity (default all 1)."""
    if cluster is not None:
        if capacities is not None or kinds is not None:
            raise InputError("give either cluster or capacities/kinds, not both", where="partition()")
        return cluster
    caps = [1.0] * num_stages if capacities is None else list(capacities)
    if isinstance(kinds, str):
        kinds = [kinds] * len(caps)
    return Cluster.from_capacities(caps, bandwidth_gbps=bandwidth_gbps, latency_ms=latency_ms, kinds=kinds)


def _device_orders(p: Problem) -> List[List[int]]:
    devs = p.default_devices()
    orders = [devs]
    if len(set((p.cap[d], p.kind_of_dev[d]) for d in devs)) > 1:
        speed = {d: p.cap[d] * p.comp[0].sum() / max(p.comp[p.kind_of_dev[d]].sum(), 1e-12) for d in devs}
        orders.append(sorted(devs, key=lambda d: (-speed[d], d)))
        orders.append(sorted(devs, key=lambda d: (speed[d], d)))
    out: List[List[int]] = []
    for o in orders:
        if o not in out:
            out.append(o)
    return out


def _best(p: Problem, plans: Sequence[Plan]) -> Plan:
    return min(plans, key=lambda sd: p.objective(*sd))


def _dp_method(p: Problem, fn) -> Plan:
    return _best(p, [(fn(p, o), o) for o in _device_orders(p)])


def _to_plan(p: Problem, method: str, stage: Sequence[int], devs: Sequence[int], search_s: float,
             extra: Dict) -> PartitionPlan:
    p.check(stage, devs)
    ev = p.evaluate(stage, devs)
    g = p.graph
    son = {name: int(stage[p.index[name]]) for name in g.nodes}
    extra = dict(extra)
    extra.update({"hop_bytes": ev.hop_bytes, "stage_penalty_ms": ev.stage_penalty_ms, "feasible": ev.feasible,
                  "capacities": [p.cap[d] for d in devs], "kinds": [p.cluster.devices[d].kind for d in devs]})
    return PartitionPlan(method=method, stage_of_node=son, device_of_stage=[int(d) for d in devs],
                         stage_compute_ms=ev.stage_compute_ms, stage_comm_ms=ev.stage_comm_ms,
                         stage_memory_bytes=ev.stage_memory_bytes, objective=ev.objective,
                         comm_bytes=ev.comm_bytes, search_s=search_s, graph_name=g.name, extra=extra)


def partition(graph: CostGraph, num_stages: int, method: str = "ga", capacities: Optional[Sequence[float]] = None,
              bandwidth_gbps: float = 10.0, latency_ms: float = 0.0,
              memory: Union[None, float, Sequence[Optional[float]]] = None, seed: int = 0,
              cluster: Optional[Cluster] = None, kinds: Union[None, str, Sequence[Optional[str]]] = None,
              progress: Optional[Callable[[int, int, float], None]] = None, score: str = "objective",
              schedule: str = "gpipe", microbatches: Optional[int] = None) -> PartitionPlan:
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
        score: ``"objective"`` (default) or ``"simulated"``: ``local``/``ga`` return the candidate with the
            best simulated time (:mod:`simrank`); the search itself always uses the objective.
        schedule: ``"gpipe"`` (iteration time) or ``"1f1b"`` (time per mini-batch in steady state), for
            ``score="simulated"``.
        microbatches: micro-batches simulated (default ``4 * num_stages`` for GPipe, ``8 * num_stages`` for 1F1B).
    """
    if method not in METHODS:
        raise InputError(f"unknown method {method!r}; choose from {', '.join(METHODS)}", where="method")
    if not isinstance(graph, CostGraph):
        raise InputError(f"graph must be a CostGraph, got {type(graph).__name__}", where="graph")
    check_score(score, schedule, microbatches)
    cl = make_cluster(num_stages, capacities, bandwidth_gbps, latency_ms, kinds, cluster)
    for d in cl.devices:
        if d.kind is not None and d.kind not in graph.kinds:
            raise InputError(f"device kind {d.kind!r} has no costs in the graph (kinds: {graph.kinds or 'none'})",
                             where=f"device {d.name!r}")
    t0 = time.perf_counter()
    p = Problem(graph, cl, num_stages, memory)
    extra: Dict = {"bandwidth_gbps": cl.default_link.bandwidth_gbps, "latency_ms": cl.default_link.latency_ms,
                   "seed": seed}
    if method == "layerwise":
        devs = p.default_devices()
        stage, devs = baselines.layerwise(p, devs), devs
    elif method == "balanced":
        stage, devs = _dp_method(p, baselines.balanced)
    elif method == "pipedream":
        stage, devs = _dp_method(p, baselines.pipedream)
    else:
        starts = [_dp_method(p, baselines.balanced), _dp_method(p, baselines.pipedream)]
        locals_ = [local_search(p, s, d, seed=seed) for s, d in starts]
        stage, devs = _best(p, locals_)
        candidates: List[Plan] = []
        if score == "simulated":            # every baseline plan is a candidate (the guarantee)
            candidates.append((baselines.layerwise(p, p.default_devices()), p.default_devices()))
            for fn in (baselines.balanced, baselines.pipedream):
                candidates += [(fn(p, o), o) for o in _device_orders(p)]
            candidates += starts + locals_
        if method == "ga":
            seeds: List[Plan] = [(baselines.layerwise(p, p.default_devices()), p.default_devices())]
            seeds += starts + locals_
            dfs = dfs_topological_order(p.pred, p.succ)
            for o in _device_orders(p):
                for perm in (None, dfs):
                    s = baselines.contiguous_optimal(p, o, perm)
                    seeds.append((s, o))
                    seeds.append(local_search(p, s, o, seed=seed))
            seeds.sort(key=lambda sd: p.objective(*sd))
            stage, devs, info = genetic(p, seeds, seed=seed, progress=progress)
            extra.update({k: v for k, v in info.items() if k not in ("history", "population")})
            if score == "simulated":
                candidates += seeds + info["population"]
        if score == "simulated":
            m = microbatches or default_microbatches(schedule, num_stages)
            (stage, devs), sinfo = best_simulated(p, candidates,
                                                  lambda s_, d_: _to_plan(p, method, s_, d_, 0.0, {}), schedule, m)
            extra.update(sinfo)
    if score == "simulated" and method in ("local", "ga"):
        extra.update({"score": score, "schedule": schedule,
                      "microbatches": microbatches or default_microbatches(schedule, num_stages)})
    return _to_plan(p, method, stage, devs, time.perf_counter() - t0, extra)


def evaluate(graph: CostGraph, stage_of_node: Dict[str, int], device_of_stage: Optional[Sequence[int]] = None,
             capacities: Optional[Sequence[float]] = None, bandwidth_gbps: float = 10.0, latency_ms: float = 0.0,
             memory: Union[None, float, Sequence[Optional[float]]] = None, cluster: Optional[Cluster] = None,
             kinds: Union[None, str, Sequence[Optional[str]]] = None, method: str = "given") -> PartitionPlan:
    """Score a given assignment (node name -> stage) with the objective; PlanError if not convex."""
    missing = [n for n in graph.nodes if n not in stage_of_node]
    if missing:
        from tf_commopt.errors import PlanError
        raise PlanError(f"node {missing[0]!r} has no stage")
    K = max(stage_of_node.values()) + 1
    cl = make_cluster(K, capacities, bandwidth_gbps, latency_ms, kinds, cluster)
    p = Problem(graph, cl, K, memory)
    devs = list(device_of_stage) if device_of_stage is not None else list(range(K))
    stage = [stage_of_node[n] for n in p.order]
    return _to_plan(p, method, stage, devs, 0.0, {})
