"""The grouped hybrid and data parallelism on heterogeneous devices, simulated (pure).

Example:
    >>> from tf_commopt.core.costgraph import CostGraph, Node
    >>> from tf_commopt.core.devices import Cluster
    >>> from tf_commopt.core.plan import HybridPlan, PartitionPlan
    >>> from tf_commopt.core.simulate.hybrid import ideal_iteration_ms, simulate_dp, simulate_grouped_hybrid
    >>> g = CostGraph([Node(f"l{i}", 1.0, 2.0) for i in range(6)], [(f"l{i}", f"l{i+1}") for i in range(5)])
    >>> c = Cluster.from_capacities([1, 0.5])
    >>> simulate_dp(g, c).iteration_ms             # straggler: 18 ms / 2 / 0.5
    18.0
    >>> round(ideal_iteration_ms(g, c), 3)         # 18 ms / (1 + 0.5)
    12.0
    >>> son = {f"l{i}": 0 if i < 4 else 1 for i in range(6)}
    >>> plan = PartitionPlan("hand", son, [0, 1], [12, 6], [0, 0], [0, 0], 12, 0)
    >>> hp = HybridPlan(groups=[[0, 1]], plans=[plan], microbatches=3, group_ms=[16.0])
    >>> round(simulate_grouped_hybrid(g, c, hp).iteration_ms, 6)     # GPipe (M + P - 1) * 4 ms
    16.0

The program (:func:`tf_commopt.core.schedule.hybrid.hybrid_program`, shared with the TensorFlow
executor) bound to costs and run by the engine (:mod:`tf_commopt.core.simulate.engine`). The plan comes
from the planner (:mod:`tf_commopt.core.planner.hybrid`); the simulator never chooses one. The rules:

* **Speed.** Device ``d`` processes ``speed_d = capacity_d / graph.total_ms(kind_d)`` profiled
  mini-batches per ms. **Ideal**: ``1 / sum_d speed_d`` (all compute shared, no communication, no
  bubble: a lower bound for any synchronous scheme).
* **Costs.** Group ``g`` with batch fraction ``f_g`` and ``M`` micro-batches: stage ``s`` on device
  ``d`` costs ``sum_{v in s} forward_ms(v, kind_d) / capacity_d * f_g / M`` per micro-batch
  (backward alike); a piece rank's backward is the same sum over its piece's nodes, and the stage
  rank's last backward is its piece 0; activations ``hop_bytes * f_g / M`` per micro-batch and hop.
  A replicated stage's replicas take shares of each micro-batch proportional to their speed on it
  (:func:`replica_shares`). Bucket ``b`` is a ring all-reduce of ``b.nbytes`` over its ranks' devices.
* **Group alone** (:func:`group_alone_ms`): a group's GPipe pipeline alone on the whole mini-batch,
  without all-reduce; the planner derives the batch split from it.
* **Data parallel** (:func:`simulate_dp`): ``split="equal"`` (synchronous SGD) or ``"proportional"``
  (share ``speed_d / sum speed``); without overlap one all-reduce of all parameters after the
  backward (:func:`tf_commopt.core.simulate.simulate_data_parallel`); with ``overlap=True`` the hybrid
  program of ``N`` one-device groups with those shares: the same buckets and overlap as the hybrid.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple, Union

from tf_commopt.core.costgraph import CostGraph
from tf_commopt.core.devices import Cluster
from tf_commopt.core.plan import HybridPlan, PartitionPlan, single_stage_plan
from tf_commopt.core.schedule.buckets import DEFAULT_BUCKET_BYTES
from tf_commopt.core.schedule.hybrid import HybridProgram, check_groups, hybrid_program, overlap_fraction
from tf_commopt.core.simulate.dataparallel import simulate_data_parallel
from tf_commopt.core.simulate.engine import Job, RankCost
from tf_commopt.core.simulate.pipeline import hop_bytes
from tf_commopt.core.simulate.result import SimResult, simulate_job
from tf_commopt.errors import InputError, PlanError

__all__ = [
    "as_cluster",
    "device_speeds",
    "ideal_iteration_ms",
    "replica_shares",
    "group_alone_ms",
    "grouped_hybrid_job",
    "simulate_grouped_hybrid",
    "simulate_dp",
]

ClusterLike = Union[Cluster, Sequence[float]]
StageDevices = Sequence[Sequence[int]]  # [stage] -> device indices of its replicas


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


def _stage_devices(hp: HybridPlan, n: int) -> List[List[Tuple[int, ...]]]:
    """Each group's stages' devices, or a one-line error if they do not fit the plans and the cluster."""
    out = []
    for g, (group, plan) in enumerate(zip(hp.groups, hp.plans)):
        k = plan.num_stages
        if hp.stage_devices is None and (k != len(group) or sorted(plan.device_of_stage) != list(range(k))):
            raise PlanError(
                f"a group of {len(group)} devices needs a plan using each of them once, got "
                f"device_of_stage={plan.device_of_stage}",
                where=f"plan {plan.method!r}",
            )
        out.append(hp.devices_of_stage(g))
    flat = [d for sd in out for reps in sd for d in reps]
    if (
        any(len(sd) != p.num_stages for sd, p in zip(out, hp.plans))
        or any(not reps for sd in out for reps in sd)
        or len(flat) != len(set(flat))
        or any(not 0 <= d < n for d in flat)
    ):
        raise InputError(
            f"stage_devices must give each stage of each plan a non-empty list of distinct device "
            f"indices in 0..{n - 1}, got {hp.stage_devices!r}",
            where="stage_devices",
        )
    return out


def _stage_ms(graph: CostGraph, nodes: Sequence[str], dev, backward: bool) -> float:
    get = graph.backward_ms if backward else graph.forward_ms
    return sum(get(v, dev.kind) for v in nodes) / dev.capacity


def replica_shares(
    graph: CostGraph, cluster: Cluster, plans: Sequence[PartitionPlan], stage_devices: Sequence[StageDevices]
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


def _rank_costs(graph, cluster, prog, plans, sdev, fractions, microbatches, optimizer_ms) -> List[RankCost]:
    streams = prog.schedule.streams
    ranks: List[RankCost] = []
    for r, role in enumerate(prog.roles):
        g, s, i = role.group, role.stage, role.replica
        d = sdev[g][s][i]
        dev = cluster.devices[d]
        scale = fractions[g] / microbatches * prog.shares[g][s][i]
        if role.piece > 0:
            ranks.append(RankCost(d, 0.0, _stage_ms(graph, role.nodes, dev, True) * scale, 0.0))
            continue
        nodes = plans[g].nodes_of_stage(s)
        f, b = _stage_ms(graph, nodes, dev, False) * scale, _stage_ms(graph, nodes, dev, True) * scale
        override = {}
        if prog.overlap:
            mb = [x for x in streams[r] if type(x).__name__ == "Backward"][-1].mb
            override = {mb: _stage_ms(graph, role.nodes, dev, True) * scale}
        ranks.append(RankCost(d, f, b, optimizer_ms, backward_mb=override))
    return ranks


def _bind(
    graph: CostGraph,
    cluster: Cluster,
    prog: HybridProgram,
    plans: Sequence[PartitionPlan],
    sdev: Sequence[StageDevices],
    fractions: Sequence[float],
    microbatches: int,
    optimizer_ms: float,
    collectives: bool = True,
) -> Job:
    """Costs and bytes of every rank and message of ``prog`` (see the module docstring)."""
    hops = [hop_bytes(graph, p.stage_of_node, p.num_stages) for p in plans]
    ranks = _rank_costs(graph, cluster, prog, plans, sdev, fractions, microbatches, optimizer_ms)
    msgs: Dict[Tuple[str, int, int], float] = {}
    for r, st in enumerate(prog.schedule.streams):
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
            kind = "act" if t == "SendAct" else "grad"
            msgs[(kind, r, ins.peer)] = hops[g][lo] * fractions[g] / microbatches * ov
    coll = {bk.key: (bk.nbytes if collectives else 0.0) for bk in prog.buckets}
    return Job(prog.schedule, ranks, cluster, msgs, coll, split=microbatches)


def group_alone_ms(
    graph: CostGraph,
    cluster: Cluster,
    plan: PartitionPlan,
    stage_devices: StageDevices,
    microbatches: int,
    optimizer_ms: float = 0.0,
) -> float:
    """A group's GPipe pipeline alone on the whole mini-batch (all-reduces free), simulated.

    ``stage_devices[s]``: the cluster devices of stage ``s``'s replicas.
    """
    sdev = [[tuple(int(d) for d in reps) for reps in stage_devices]]
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


def grouped_hybrid_job(
    graph: CostGraph,
    cluster: Cluster,
    plan: HybridPlan,
    optimizer_ms: float = 0.0,
    overlap: bool = True,
    bucket_bytes: Optional[float] = DEFAULT_BUCKET_BYTES,
) -> Tuple[Job, HybridProgram]:
    """The hybrid program of ``plan`` (:func:`tf_commopt.core.schedule.hybrid.hybrid_program`) bound to
    costs; also the program."""
    check_groups(plan.groups, len(cluster))
    sdev = _stage_devices(plan, len(cluster))
    order = graph.topological_order()
    prog = hybrid_program(
        order,
        {v: graph[v].param_bytes for v in order},
        [p.stage_of_node for p in plan.plans],
        plan.microbatches,
        overlap,
        bucket_bytes,
        [p.num_stages for p in plan.plans],
        replica_shares(graph, cluster, plan.plans, sdev),
    )
    fr = plan.batch_fractions
    return _bind(graph, cluster, prog, plan.plans, sdev, fr, plan.microbatches, optimizer_ms), prog


def simulate_grouped_hybrid(
    graph: CostGraph,
    cluster: ClusterLike,
    plan: HybridPlan,
    optimizer_ms: float = 0.0,
    overlap: bool = True,
    bucket_bytes: Optional[float] = DEFAULT_BUCKET_BYTES,
) -> SimResult:
    """One grouped hybrid iteration of ``plan`` (see the module docstring).

    Args:
        graph: the profile (times and bytes per profiled mini-batch).
        cluster: a Cluster, or capacities.
        plan: the groups, their plans, micro-batches and batch split
            (:func:`tf_commopt.core.planner.hybrid.plan_hybrid`).
        optimizer_ms: cost of each ``OptimizerStep``.
        overlap, bucket_bytes: see :func:`tf_commopt.core.schedule.hybrid.hybrid_program`.

    Returns:
        SimResult; ``extra`` has ``groups``, ``stage_devices``, ``batch_fractions``, ``microbatches``,
        ``stage_layers``, ``plan_methods``, ``allreduce_chunks`` (buckets), ``allreduce_bytes``, ``overlap``.
    """
    cl = as_cluster(cluster)
    job, prog = grouped_hybrid_job(graph, cl, plan, optimizer_ms, overlap, bucket_bytes)
    res = simulate_job(job)
    res.extra.update(
        {
            "groups": [list(g) for g in plan.groups],
            "stage_devices": None
            if plan.stage_devices is None
            else [[list(r) for r in sd] for sd in plan.stage_devices],
            "batch_fractions": plan.batch_fractions,
            "microbatches": plan.microbatches,
            "overlap": overlap,
            "stage_layers": [[len(p.nodes_of_stage(s)) for s in range(p.num_stages)] for p in plan.plans],
            "plan_methods": [p.method for p in plan.plans],
            "allreduce_chunks": len(prog.buckets),
            "allreduce_bytes": sum(b.nbytes for b in prog.buckets),
        }
    )
    return res


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
    n = len(cl)
    if split == "equal":
        fr = [1.0 / n] * n
    elif split == "proportional":
        sp = device_speeds(graph, cl)
        fr = [s / sum(sp) for s in sp]
    else:
        raise InputError(f"split must be 'equal' or 'proportional', got {split!r}", where="split")
    if overlap:
        one = single_stage_plan(graph)
        hp = HybridPlan([[i] for i in range(n)], [one] * n, microbatches, [1.0] * n, weights=fr)
        res = simulate_grouped_hybrid(graph, cl, hp, optimizer_ms, True, bucket_bytes)
    else:
        res = simulate_data_parallel(graph, cl, microbatches, None if split == "equal" else fr, optimizer_ms)
    res.extra.update({"split": split, "overlap": overlap, "batch_fractions": fr})
    return res
