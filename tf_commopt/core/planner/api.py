"""``partition`` scored by what runs, and external assignments loaded as plans.

Example:
    >>> from tf_commopt.core.partition.synthetic import branchy_graph
    >>> from tf_commopt.core.planner.api import partition, given_plan
    >>> g = branchy_graph(40, seed=2)
    >>> plan = partition(g, 3, method="ga", schedule="1f1b", bandwidth_gbps=25.0)
    >>> plan.extra["score"], plan.schedule, plan.microbatches
    ('simulated', '1f1b', 24)
    >>> again = given_plan(g, plan.stage_of_node, bandwidth_gbps=25.0, schedule="1f1b")
    >>> again.method, again.extra["simulated_ms"] >= plan.extra["simulated_ms"] * (1 - 1e-9)
    ('given', True)

:func:`partition` is :func:`tf_commopt.core.partition.api.partition` with ``score="simulated"`` by default:
the search minimises the pipeline time of ``schedule`` with ``microbatches`` (closed form,
:mod:`tf_commopt.core.partition.pipemodel`) and the final choice among the candidates is made in the
discrete-event simulator (:mod:`simrank`). ``score="pipeline"`` skips the simulator (for GPipe the model
is exact, so the plan is the same); ``score="objective"`` is the additive objective alone.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Dict, Mapping, Optional, Sequence, Union

from tf_commopt.core.costgraph import CostGraph
from tf_commopt.core.devices import Cluster
from tf_commopt.core.partition.api import (
    check_score,
    cluster_record,
    default_microbatches,
    evaluate,
    make_cluster,
)
from tf_commopt.core.partition.api import (
    partition as _search,
)
from tf_commopt.core.partition.objective import Problem
from tf_commopt.core.plan import PartitionPlan
from tf_commopt.core.planner.simrank import simulated_ms, simulator_ranker
from tf_commopt.errors import InputError, PlanError

__all__ = ["partition", "given_plan", "read_stage_ids"]


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
    score: str = "simulated",
    schedule: str = "gpipe",
    microbatches: Optional[int] = None,
) -> PartitionPlan:
    """Partition ``graph`` into ``num_stages`` stages; by default the plan fastest in simulation.

    Arguments as :func:`tf_commopt.core.partition.api.partition`; ``score`` defaults to ``"simulated"``.
    The plan records its cluster, schedule and micro-batches (``plan.cluster``, ``plan.schedule``,
    ``plan.microbatches``) so ``python -m tf_commopt.sim`` simulates what it was made for.
    """
    check_score(score, schedule, microbatches)
    m = microbatches or default_microbatches(schedule, num_stages)
    rank = simulator_ranker(schedule, m) if score == "simulated" else None
    return _search(
        graph,
        num_stages,
        method=method,
        capacities=capacities,
        bandwidth_gbps=bandwidth_gbps,
        latency_ms=latency_ms,
        memory=memory,
        seed=seed,
        cluster=cluster,
        kinds=kinds,
        progress=progress,
        score=score,
        schedule=schedule,
        microbatches=m,
        rank=rank,
    )


_STAGE_ID = re.compile(r"(?:^|[,\s])stage_id=\s*(-?\d+)\s*(?:,|$)")


def read_stage_ids(path: str) -> Dict[str, int]:
    """Node -> stage of a PipeDream optimizer output (a ``graph.txt`` whose node lines carry ``stage_id=N``).

    One-line :class:`InputError` naming ``path:line`` and the node for a node without ``stage_id`` or a
    bad value; an error if no node has one.
    """
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read assignment: {e}", where=path) from None
    out: Dict[str, int] = {}
    missing = None
    for i, raw in enumerate(lines, 1):
        if not raw.strip() or raw[0] in "\t ":
            continue
        name = raw.split(" -- ", 1)[0].strip()
        attrs = raw.rsplit(" -- ", 1)[-1]
        mt = _STAGE_ID.search(attrs)
        if mt is None:
            missing = missing or (name, i)
            continue
        sid = int(mt.group(1))
        if sid < 0:
            raise InputError(f"node {name!r}: stage_id {sid} is negative", where=f"{path}:{i}")
        out[name] = sid
    if not out:
        raise InputError("no node line carries stage_id=N (not a PipeDream optimizer output?)", where=path)
    if missing is not None:
        raise InputError(f"node {missing[0]!r} has no stage_id", where=f"{path}:{missing[1]}")
    return out


def given_plan(
    graph: CostGraph,
    assignment: Union[str, Mapping[str, int]],
    device_of_stage: Optional[Sequence[int]] = None,
    capacities: Optional[Sequence[float]] = None,
    bandwidth_gbps: float = 10.0,
    latency_ms: float = 0.0,
    memory: Union[None, float, Sequence[Optional[float]]] = None,
    cluster: Optional[Cluster] = None,
    kinds: Union[None, str, Sequence[Optional[str]]] = None,
    schedule: str = "gpipe",
    microbatches: Optional[int] = None,
) -> PartitionPlan:
    """An external assignment (node -> stage, or a path to a graph.txt with ``stage_id``) as a plan.

    Stages are renumbered ``0..K-1`` in their given order (PipeDream's ids may skip numbers); stage
    ``s`` runs on ``device_of_stage[s]`` (default device ``s``). The plan is scored like any other
    (objective, pipeline model and simulated time in ``extra``) and records its cluster, schedule and
    micro-batches. Errors (a node without a stage, an edge going back) name the node.
    """
    where = assignment if isinstance(assignment, str) else "assignment"
    son = read_stage_ids(assignment) if isinstance(assignment, str) else dict(assignment)
    extra_nodes = [n for n in son if n not in graph]
    if extra_nodes:
        raise InputError(f"node {extra_nodes[0]!r} is not in the profile {graph.name!r}", where=where)
    missing = [n for n in graph.topological_order() if n not in son]
    if missing:
        raise InputError(f"node {missing[0]!r} has no stage ({len(missing)} missing)", where=where)
    ids = sorted(set(son.values()))
    renum = {s: i for i, s in enumerate(ids)}
    son = {n: renum[s] for n, s in son.items()}
    K = len(ids)
    check_score("simulated", schedule, microbatches)
    m = microbatches or default_microbatches(schedule, K)
    cl = make_cluster(K, capacities, bandwidth_gbps, latency_ms, kinds, cluster)
    if K > len(cl):
        raise InputError(f"the assignment has {K} stages but the cluster only {len(cl)} devices", where=where)
    try:
        plan = evaluate(graph, son, device_of_stage, cluster=cl, memory=memory, method="given")
    except PlanError as e:
        raise InputError(str(e).splitlines()[0], where=where) from None
    p = Problem(graph, cl, K, memory, stash_weights=(schedule == "1f1b"))
    extra = dict(plan.extra)
    extra.update(
        {
            "score": "given",
            "simulated_ms": simulated_ms(p, plan, schedule, m),
            "source": where,
            "bandwidth_gbps": cl.default_link.bandwidth_gbps,
            "latency_ms": cl.default_link.latency_ms,
        }
    )
    return dataclasses.replace(
        plan, extra=extra, cluster=cluster_record(cl, memory), schedule=schedule, microbatches=m
    )
