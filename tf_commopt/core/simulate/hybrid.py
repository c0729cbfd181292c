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
    DEFAULT_BUCKET_BYTES,
    GROUPINGS,
    HybridProgram,
    batch_fractions,
    check_groups,
    contiguous_groups,
    hybrid_program,
    overlap_fraction,
    snake_groups,
)
from tf_commopt.core.plan import PartitionPlan
from tf_commopt.core.simulate.dataparallel import simulate_data_parallel
from tf_commopt.core.simulate.engine import Job, RankCost
from tf_commopt.core.simulate.pipeline import hop_bytes
from tf_commopt.core.simulate.result import SimResult, simulate_job
from tf_commopt.errors import InputError, PlanError

__all__ = [
    "device_speeds",
    "ideal_iteration_ms",
    "simulate_dp",
    "snake_groups",
    "contiguous_groups",
    "GROUPINGS",
    "sub_cluster",
    "group_plans",
    "group_alone_ms",
    "grouped_hybrid_job",
    "simulate_grouped_hybrid",
    "search_grouped_hybrid",
    "as_cluster",
    "single_stage_plan",
]

ClusterLike = Union[Cluster, Sequence[float]]


def as_cluster(
    cluster: ClusterLike,
    bandwidth_gbps: float = 10.0,
    latency_ms: float = 0.0,
    kinds: Optional[Sequence[Optional[str]]] = None,
) -> Cluster:
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
            raise InputError(
                f"graph {graph.name!r} has no compute time for kind {d.kind!r}", where=f"device {d.name!r}"
            )
        out.append(d.capacity / t)
    return out


def ideal_iteration_ms(graph: CostGraph, cluster: ClusterLike) -> float:
    """The capacity-proportional ideal ``1 / sum_d speed_d`` (no communication, no bubble)."""
    return 1.0 / sum(device_speeds(graph, as_cluster(cluster)))


def simulate_dp(
    graph: CostGraph,
    cluster: ClusterLike,
    split: str = "equal",
    microbatches: int = 1,
    optimizer_ms: float = 0.0,
    overlap: bool = False,
    bucket_bytes: Optional[float] = DEFAULT_BUCKET_BYTES,
) -> SimResult:
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
        res = simulate_grouped_hybrid(
            graph,
            cl,
            [[i] for i in range(n)],
            microbatches,
            plans=[single_stage_plan(graph)] * n,
            batch_fractions=fr or [1.0 / n] * n,
            optimizer_ms=optimizer_ms,
            overlap=True,
            bucket_bytes=bucket_bytes,
        )
    else:
        res = simulate_data_parallel(graph, cl, microbatches, fr, optimizer_ms)
    res.extra.update({"split": split, "overlap": overlap, "batch_fractions": fr or [1.0 / len(cl)] * len(cl)})
    return res


def single_stage_plan(graph: CostGraph) -> PartitionPlan:
    """The whole graph as one stage on the group's only device."""
    t = graph.total_ms()
    return PartitionPlan(
        "single",
        {v: 0 for v in graph.topological_order()},
        [0],
        [t],
        [0.0],
        [0.0],
        t,
        0.0,
        graph_name=graph.name,
    )


def sub_cluster(cluster: Cluster, group: Sequence[int]) -> Cluster:
    """The devices ``group`` of ``cluster`` (renumbered 0..len-1) with their links."""
    pos = {d: k for k, d in enumerate(group)}
    links = {(pos[a], pos[b]): lk for (a, b), lk in cluster.links.items() if a in pos and b in pos}
    return Cluster([cluster.devices[i] for i in group], cluster.default_link, links)


StageDevices = Sequence[Sequence[Sequence[int]]]  # [group][stage] -> device indices of its replicas


def _stage_devices(
    groups: Sequence[Sequence[int]],
    plans: Sequence[PartitionPlan],
    stage_devices: Optional[StageDevices],
    n: int,
) -> List[List[Tuple[int, ...]]]:
    if stage_devices is None:
        out = []
        for group, plan in zip(groups, plans):
            k = plan.num_stages
            if k != len(group) or sorted(plan.device_of_stage) != list(range(k)):
                raise PlanError(
                    f"a group of {len(group)} devices needs a plan using each of them once, got "
                    f"device_of_stage={plan.device_of_stage}",
                    where=f"plan {plan.method!r}",
                )
            out.append([(group[plan.device_of_stage[s]],) for s in range(k)])
        return out
    out = [[tuple(int(d) for d in reps) for reps in sd] for sd in stage_devices]
    flat = [d for sd in out for reps in sd for d in reps]
    if (
        len(out) != len(plans)
        or any(len(sd) != p.num_stages for sd, p in zip(out, plans))
        or any(not reps for sd in out for reps in sd)
        or len(flat) != len(set(flat))
        or any(not 0 <= d < n for d in flat)
    ):
        raise InputError(
            f"stage_devices must give each stage of each plan a non-empty list of distinct device "
            f"indices in 0..{n - 1}, got {stage_devices!r}",
            where="stage_devices",
        )
    return out


def _stage_ms(graph: CostGraph, nodes: Sequence[str], dev, backward: bool) -> float:
    get = graph.backward_ms if backward else graph.forward_ms
    return sum(get(v, dev.kind) for v in nodes) / dev.capacity


def replica_shares(
    graph: CostGraph,
    cluster: Cluster,
    plans: Sequence[PartitionPlan],
    stage_devices: Sequence[Sequence[Sequence[int]]],
) -> List[List[Tuple[float, ...]]]:
    """Each replica's share of its stage's micro-batch: proportional to its speed on that stage
    (``capacity / stage compute ms on its kind``), so the replicas of a stage finish together."""
    out = []
    for plan, sd in zip(plans, stage_devices):
        row = []
        for s, reps in enumerate(sd):
            nodes = plan.nodes_of_stage(s)
            sp = []
            for d in reps:
                t = sum(graph.compute_ms(v, cluster.devices[d].kind) for v in nodes)
                sp.append(cluster.devices[d].capacity / t if t > 0 else cluster.devices[d].capacity)
            row.append(tuple(x / sum(sp) for x in sp))
        out.append(row)
    return out


def _bind(
    graph: CostGraph,
    cluster: Cluster,
    prog: HybridProgram,
    plans: Sequence[PartitionPlan],
    sdev: Sequence[Sequence[Tuple[int, ...]]],
    fractions: Sequence[float],
    microbatches: int,
    optimizer_ms: float,
    collectives: bool = True,
) -> Job:
    """Costs and bytes of every rank and message of ``prog`` (see module docstring)."""
    hops = [hop_bytes(graph, p.stage_of_node, p.num_stages) for p in plans]
    ranks: List[RankCost] = []
    streams = prog.schedule.streams
    for r, role in enumerate(prog.roles):
        g, s, i = role.group, role.stage, role.replica
        d = sdev[g][s][i]
        dev = cluster.devices[d]
        scale = fractions[g] / microbatches * prog.shares[g][s][i]
        if role.piece == 0:
            nodes = plans[g].nodes_of_stage(s)
            f, b = _stage_ms(graph, nodes, dev, False) * scale, _stage_ms(graph, nodes, dev, True) * scale
            override = {}
            if prog.overlap:
                mb = [x for x in streams[r] if type(x).__name__ == "Backward"][-1].mb
                override = {mb: _stage_ms(graph, role.nodes, dev, True) * scale}
            ranks.append(RankCost(d, f, b, optimizer_ms, backward_mb=override))
        else:
            ranks.append(RankCost(d, 0.0, _stage_ms(graph, role.nodes, dev, True) * scale, 0.0))
    msgs: Dict[Tuple[str, int, int], float] = {}
    for r, st in enumerate(streams):
        a = prog.roles[r]
        for ins in st:
            t = type(ins).__name__
            if t not in ("SendAct", "SendGrad"):
                continue
            b = prog.roles[ins.peer]
            if a.group != b.group or a.stage == b.stage:
                continue  # piece hand-offs and done signals: same device, no bytes
            g, lo = a.group, min(a.stage, b.stage)
            ia, ib = (a.replica, b.replica) if a.stage < b.stage else (b.replica, a.replica)
            ov = overlap_fraction(prog.shares[g][lo], ia, prog.shares[g][lo + 1], ib)
            msgs[("act" if t == "SendAct" else "grad", r, ins.peer)] = (
                hops[g][lo] * fractions[g] / microbatches * ov
            )
    coll = {bk.key: (bk.nbytes if collectives else 0.0) for bk in prog.buckets}
    return Job(prog.schedule, ranks, cluster, msgs, coll, split=microbatches)


def group_alone_ms(
    graph: CostGraph,
    cluster: Cluster,
    group: Sequence[int],
    plan: PartitionPlan,
    microbatches: int,
    optimizer_ms: float = 0.0,
    stage_devices: Optional[Sequence[Sequence[int]]] = None,
) -> float:
    """``t_g``: the group's GPipe pipeline alone on the whole mini-batch (all-reduces free), simulated."""
    sdev = _stage_devices([group], [plan], None if stage_devices is None else [stage_devices], len(cluster))
    prog = hybrid_program(
        graph.topological_order(),
        {},
        [plan.stage_of_node],
        microbatches,
        False,
        None,
        [plan.num_stages],
        replica_shares(graph, cluster, [plan], sdev),
    )
    job = _bind(graph, cluster, prog, [plan], sdev, [1.0], microbatches, optimizer_ms, collectives=False)
    return simulate_job(job).iteration_ms


def group_plans(
    graph: CostGraph,
    cluster: Cluster,
    groups: Sequence[Sequence[int]],
    method: Union[str, Sequence[str]] = "pipedream",
    microbatches: int = 4,
    seed: int = 0,
    cache: Optional[Dict] = None,
) -> List[PartitionPlan]:
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
        key = (
            tuple((d.capacity, d.kind, d.memory_bytes) for d in sub.devices),
            sub.default_link,
            tuple(sorted(sub.links.items())),
            tuple(methods),
            microbatches,
            seed,
            id(graph),
        )
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


def grouped_hybrid_job(
    graph: CostGraph,
    cluster: Cluster,
    groups: Sequence[Sequence[int]],
    plans: Sequence[PartitionPlan],
    microbatches: int = 4,
    batch_fractions: Optional[Sequence[float]] = None,
    optimizer_ms: float = 0.0,
    overlap: bool = True,
    bucket_bytes: Optional[float] = DEFAULT_BUCKET_BYTES,
    stage_devices: Optional[StageDevices] = None,
) -> Tuple[Job, List[float], HybridProgram]:
    """The hybrid program (:func:`tf_commopt.core.hybrid.hybrid_program`) bound to costs; also the batch
    fractions and the program. ``stage_devices[g][s]``: the devices of stage s's replicas (default:
    one, ``groups[g][plan.device_of_stage[s]]``); ``groups`` then only counts the groups."""
    gs = check_groups(groups, len(cluster))
    if len(plans) != len(gs):
        raise InputError(f"{len(plans)} plans for {len(gs)} groups", where="plans")
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise InputError(
            f"microbatches must be a positive integer, got {microbatches!r}", where="microbatches"
        )
    sdev = _stage_devices(gs, plans, stage_devices, len(cluster))
    G = len(gs)
    if batch_fractions is None:
        fr = batch_fractions_of(graph, cluster, plans, sdev, microbatches, optimizer_ms)
    else:
        fr = [float(f) for f in batch_fractions]
        if len(fr) != G or any(not f > 0 for f in fr):
            raise InputError(
                f"batch_fractions must be {G} positive numbers, got {list(batch_fractions)}",
                where="batch_fractions",
            )
    order = graph.topological_order()
    prog = hybrid_program(
        order,
        {v: graph[v].param_bytes for v in order},
        [p.stage_of_node for p in plans],
        microbatches,
        overlap,
        bucket_bytes,
        [p.num_stages for p in plans],
        replica_shares(graph, cluster, plans, sdev),
    )
    return _bind(graph, cluster, prog, plans, sdev, fr, microbatches, optimizer_ms), fr, prog


def batch_fractions_of(
    graph: CostGraph,
    cluster: Cluster,
    plans: Sequence[PartitionPlan],
    stage_devices: Sequence[Sequence[Sequence[int]]],
    microbatches: int,
    optimizer_ms: float = 0.0,
) -> List[float]:
    """:func:`tf_commopt.core.hybrid.batch_fractions` of the groups' simulated times alone."""
    return batch_fractions(
        [
            group_alone_ms(
                graph, cluster, sorted(d for reps in sd for d in reps), p, microbatches, optimizer_ms, sd
            )
            for p, sd in zip(plans, stage_devices)
        ]
    )


def simulate_grouped_hybrid(
    graph: CostGraph,
    cluster: ClusterLike,
    groups: Sequence[Sequence[int]],
    microbatches: int = 4,
    plans: Optional[Sequence[PartitionPlan]] = None,
    method: Union[str, Sequence[str]] = "pipedream",
    batch_fractions: Optional[Sequence[float]] = None,
    seed: int = 0,
    optimizer_ms: float = 0.0,
    bandwidth_gbps: float = 10.0,
    latency_ms: float = 0.0,
    kinds: Optional[Sequence[Optional[str]]] = None,
    cache: Optional[Dict] = None,
    overlap: bool = True,
    bucket_bytes: Optional[float] = DEFAULT_BUCKET_BYTES,
) -> SimResult:
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
    job, fr, prog = grouped_hybrid_job(
        graph, cl, gs, plans, microbatches, batch_fractions, optimizer_ms, overlap, bucket_bytes
    )
    res = simulate_job(job)
    res.extra.update(
        {
            "groups": gs,
            "batch_fractions": fr,
            "microbatches": microbatches,
            "overlap": overlap,
            "stage_layers": [[len(p.nodes_of_stage(s)) for s in range(p.num_stages)] for p in plans],
            "plan_methods": [p.method for p in plans],
            "allreduce_chunks": len(prog.buckets),
            "allreduce_bytes": sum(b.nbytes for b in prog.buckets),
        }
    )
    return res


REPLICA_SHAPES = ("snake", "contiguous", "wide_first_fast", "wide_first_slow")


def replica_sets(speeds: Sequence[float], num_stages: int, shape: str) -> List[List[int]]:
    """Devices of each stage of a one-group pipeline with replicated stages (``num_stages`` sets).

    ``snake`` / ``contiguous``: the grouping rules (sizes differ by at most one); ``wide_first_fast``:
    the ``P - 1`` fastest devices one per stage 1..P-1 and all others replicate stage 0 (PipeDream's
    "many replicas of the early layers, one device for the last ones"); ``wide_first_slow``: the same
    with the ``P - 1`` slowest devices.

    >>> replica_sets([1, 1, 0.5, 0.25], 2, "wide_first_fast")
    [[1, 2, 3], [0]]
    """
    n = len(speeds)
    if shape in GROUPINGS:
        return GROUPINGS[shape](speeds, num_stages)
    if shape not in REPLICA_SHAPES:
        raise InputError(
            f"unknown replica shape {shape!r}; choose from {list(REPLICA_SHAPES)}", where="shape"
        )
    if not 1 <= num_stages <= n:
        raise InputError(f"num_stages must be in 1..{n}, got {num_stages}", where="num_stages")
    order = sorted(range(n), key=lambda i: (-float(speeds[i]), i))
    singles = order[: num_stages - 1] if shape == "wide_first_fast" else order[n - num_stages + 1 :]
    rest = sorted(set(range(n)) - set(singles))
    return [rest] + [[d] for d in singles]


def replicated_plan(
    graph: CostGraph, cluster: Cluster, sets: Sequence[Sequence[int]], method: str = "balanced", seed: int = 0
) -> Tuple[PartitionPlan, List[Tuple[int, ...]]]:
    """A one-group plan whose stage s runs on the replica set ``sets[plan.device_of_stage[s]]``: the
    capacity-aware partitioner on *virtual devices*, one per set, of the set's total capacity (and its
    kind if all its devices share one); returns the plan and each stage's devices."""
    from tf_commopt.core.partition.api import partition  # lazy: partition.simrank imports the simulator

    caps, kinds = [], []
    for reps in sets:
        caps.append(sum(cluster.devices[d].capacity for d in reps))
        ks = {cluster.devices[d].kind for d in reps}
        kinds.append(ks.pop() if len(ks) == 1 else None)
    virt = Cluster.from_capacities(
        caps, cluster.default_link.bandwidth_gbps, cluster.default_link.latency_ms, kinds=kinds
    )
    plan = partition(graph, len(sets), method=method, cluster=virt, seed=seed)
    return plan, [tuple(sorted(sets[plan.device_of_stage[s]])) for s in range(plan.num_stages)]


def simulate_replicated(
    graph: CostGraph,
    cluster: ClusterLike,
    plan: PartitionPlan,
    stage_devices: Sequence[Sequence[int]],
    microbatches: int = 4,
    optimizer_ms: float = 0.0,
    overlap: bool = True,
    bucket_bytes: Optional[float] = DEFAULT_BUCKET_BYTES,
) -> SimResult:
    """One pipeline whose stage s is replicated on ``stage_devices[s]`` (data parallel inside the stage)."""
    cl = as_cluster(cluster)
    _stage_devices([[0]], [plan], [stage_devices], len(cl))  # one-line error before anything else
    flat = sorted(d for reps in stage_devices for d in reps)
    job, fr, prog = grouped_hybrid_job(
        graph, cl, [flat], [plan], microbatches, [1.0], optimizer_ms, overlap, bucket_bytes, [stage_devices]
    )
    res = simulate_job(job)
    res.extra.update(
        {
            "groups": [flat],
            "stage_devices": [[list(r) for r in stage_devices]],
            "batch_fractions": fr,
            "microbatches": microbatches,
            "overlap": overlap,
            "stage_layers": [[len(plan.nodes_of_stage(s)) for s in range(plan.num_stages)]],
            "plan_methods": [plan.method],
            "allreduce_chunks": len(prog.buckets),
            "allreduce_bytes": sum(b.nbytes for b in prog.buckets),
        }
    )
    return res


def search_grouped_hybrid(
    graph: CostGraph,
    cluster: ClusterLike,
    group_counts: Optional[Sequence[int]] = None,
    groupings: Sequence[str] = ("snake", "contiguous"),
    microbatches: Union[int, Sequence[int]] = 4,
    method: Union[str, Sequence[str]] = "pipedream",
    seed: int = 0,
    optimizer_ms: float = 0.0,
    cache: Optional[Dict] = None,
    overlap: bool = True,
    bucket_bytes: Optional[float] = DEFAULT_BUCKET_BYTES,
    replicated: Sequence[str] = (),
) -> SimResult:
    """The fastest simulated grouped hybrid over ``group_counts`` (default 1..N), ``groupings``,
    ``microbatches`` (one or several counts) and the plans of ``method`` (see :func:`group_plans`);
    with ``replicated`` (shapes of :func:`replica_sets`) also one pipeline of ``P = 2..N-1`` replicated
    stages per shape and method (:func:`replicated_plan`).

    ``extra["candidates"]`` lists every ``{"num_groups", "grouping", "groups", "microbatches",
    "iteration_ms"}`` tried (``"stage_devices"`` too for replicated ones). ``G = N`` (one-device groups)
    is capacity-proportional data parallel with the same overlap, so the result is never slower than
    ``simulate_dp(..., "proportional", overlap=...)`` with the same bucket size.
    """
    cl = as_cluster(cluster)
    n = len(cl)
    counts = list(range(1, n + 1)) if group_counts is None else list(group_counts)
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
    ms_list = [microbatches] if isinstance(microbatches, int) else list(microbatches)
    methods = [method] if isinstance(method, str) else list(method)
    speeds = device_speeds(graph, cl)
    cache = {} if cache is None else cache
    best: Optional[SimResult] = None
    cands, seen = [], set()

    def consider(r: SimResult, cand: Dict) -> None:
        nonlocal best
        cand["iteration_ms"] = r.iteration_ms
        cands.append(cand)
        if best is None or r.iteration_ms < best.iteration_ms:
            best = r
            best.extra["grouping"] = cand["grouping"]

    for G in counts:
        for gname in groupings:
            groups = GROUPINGS[gname](speeds, G)
            for m in ms_list:
                m = m if G < n else 1  # one-device groups: data parallel, no micro-batches
                key = (tuple(map(tuple, groups)), m)
                if key in seen:
                    continue
                seen.add(key)
                r = simulate_grouped_hybrid(
                    graph,
                    cl,
                    groups,
                    m,
                    method=method,
                    seed=seed,
                    optimizer_ms=optimizer_ms,
                    cache=cache,
                    overlap=overlap,
                    bucket_bytes=bucket_bytes,
                )
                consider(r, {"num_groups": G, "grouping": gname, "groups": groups, "microbatches": m})
    for P in range(2, n):
        for shape in replicated:
            sets = replica_sets(speeds, P, shape)
            for meth in methods:
                key = ("rep", tuple(map(tuple, sets)), meth)
                if key in seen:
                    continue
                seen.add(key)
                plan, sdev = replicated_plan(graph, cl, sets, meth, seed)
                for m in ms_list:
                    r = simulate_replicated(graph, cl, plan, sdev, m, optimizer_ms, overlap, bucket_bytes)
                    consider(
                        r,
                        {
                            "num_groups": 1,
                            "grouping": f"replicated:{shape}",
                            "groups": [list(range(n))],
                            "stage_devices": [list(d) for d in sdev],
                            "microbatches": m,
                        },
                    )
    assert best is not None
    best.extra["candidates"] = cands
    return best
