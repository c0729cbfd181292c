"""The plans, as plain values: :class:`PartitionPlan` (one pipeline) and :class:`HybridPlan` (a grouped
hybrid). The planner (:mod:`tf_commopt.core.planner`) makes them; the simulator and the executors
consume them.

Example:
    >>> from tf_commopt.core.plan import PartitionPlan
    >>> p = PartitionPlan(method="balanced", stage_of_node={"a": 0, "b": 1}, device_of_stage=[0, 1],
    ...                   stage_compute_ms=[3.0, 2.0], stage_comm_ms=[0.5, 0.5],
    ...                   stage_memory_bytes=[0.0, 0.0], objective=3.5, comm_bytes=1e6)
    >>> p.num_stages, p.max_stage_ms
    (2, 3.5)
    >>> PartitionPlan.from_json(p.to_json()) == p
    True
    >>> h = HybridPlan(groups=[[0, 1], [2]], plans=[p, p], microbatches=4, group_ms=[6.0, 3.0])
    >>> [round(f, 3) for f in h.batch_fractions], h.devices_of_stage(0)
    ([0.333, 0.667], [(0,), (1,)])
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from tf_commopt.errors import InputError, PlanError

__all__ = ["PartitionPlan", "HybridPlan", "single_stage_plan"]


@dataclass(frozen=True)
class PartitionPlan:
    """Stage of each node, device of each stage, and the plan's costs.

    Attributes:
        method: the partition method that produced it.
        stage_of_node: node name -> stage index (0 .. num_stages-1; stage 0 holds the inputs).
        device_of_stage: stage index -> device index in the cluster.
        stage_compute_ms: forward+backward ms of each stage on its device (capacity applied).
        stage_comm_ms: communication ms charged to each stage (activations out, gradients back).
        stage_memory_bytes: parameters + stashed activations of each stage.
        objective: the score minimised (the slowest stage's compute+comm ms, plus penalties).
        comm_bytes: bytes crossing stage boundaries per mini-batch (forward + backward).
        search_s: wall seconds the search took.
        graph_name: name of the graph partitioned.
        extra: method-specific details (JSON-serialisable).
        cluster: the cluster the plan was made for: ``capacities``, ``kinds`` and ``memory_bytes`` of
            every device, ``bandwidth_gbps`` and ``latency_ms`` of the links (None if not recorded).
        schedule: the schedule it was scored for (``"gpipe"`` / ``"1f1b"``), or None.
        microbatches: the micro-batches it was scored for, or None.
    """

    method: str
    stage_of_node: Dict[str, int]
    device_of_stage: List[int]
    stage_compute_ms: List[float]
    stage_comm_ms: List[float]
    stage_memory_bytes: List[float]
    objective: float
    comm_bytes: float
    search_s: float = 0.0
    graph_name: str = ""
    extra: Dict[str, Any] = field(default_factory=dict)
    cluster: Optional[Dict[str, Any]] = None
    schedule: Optional[str] = None
    microbatches: Optional[int] = None

    @property
    def num_stages(self) -> int:
        return len(self.device_of_stage)

    @property
    def stage_ms(self) -> List[float]:
        """Per-stage compute + communication ms."""
        return [c + m for c, m in zip(self.stage_compute_ms, self.stage_comm_ms)]

    @property
    def max_stage_ms(self) -> float:
        return max(self.stage_ms)

    def nodes_of_stage(self, stage: int) -> List[str]:
        """Names of the nodes in ``stage`` (in the plan's node order)."""
        return [n for n, s in self.stage_of_node.items() if s == stage]

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["stages"] = self.num_stages
        d["max_stage_ms"] = self.max_stage_ms
        d["stage_ms"] = self.stage_ms
        d["format"] = "tf_commopt.PartitionPlan/1"
        return d

    def to_json(self, indent: Optional[int] = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "plan") -> "PartitionPlan":
        if not isinstance(d, Mapping):
            raise PlanError(f"expected a JSON object, got {type(d).__name__}", where=where)
        fmt = d.get("format", "tf_commopt.PartitionPlan/1")
        if fmt != "tf_commopt.PartitionPlan/1":
            raise PlanError(f"unknown plan format {fmt!r}", where=where)
        required = [
            "method",
            "stage_of_node",
            "device_of_stage",
            "stage_compute_ms",
            "stage_comm_ms",
            "stage_memory_bytes",
            "objective",
            "comm_bytes",
        ]
        for k in required:
            if k not in d:
                raise PlanError(f"missing field {k!r}", where=where)
        son = d["stage_of_node"]
        if not isinstance(son, Mapping) or not son:
            raise PlanError("stage_of_node must be a non-empty object", where=where)
        dos = d["device_of_stage"]
        if not isinstance(dos, list) or not dos:
            raise PlanError("device_of_stage must be a non-empty list", where=where)
        k = len(dos)
        for name, s in son.items():
            if not isinstance(name, str) or isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < k:
                raise PlanError(f"node {name!r}: stage {s!r} is not an integer in [0, {k})", where=where)
        for i, dev in enumerate(dos):
            if isinstance(dev, bool) or not isinstance(dev, int) or dev < 0:
                raise PlanError(f"device_of_stage[{i}] = {dev!r} is not a non-negative integer", where=where)
        if len(set(dos)) != len(dos):
            raise PlanError("device_of_stage places two stages on one device", where=where)
        lists = {}
        for key in ("stage_compute_ms", "stage_comm_ms", "stage_memory_bytes"):
            v = d[key]
            if not isinstance(v, list) or len(v) != k:
                raise PlanError(f"{key} must be a list of {k} numbers", where=where)
            lists[key] = [_num(x, f"{key}[{i}]", where) for i, x in enumerate(v)]
        extra = d.get("extra", {})
        if not isinstance(extra, Mapping):
            raise PlanError("extra must be an object", where=where)
        method = d["method"]
        if not isinstance(method, str):
            raise PlanError("method must be a string", where=where)
        cluster = _cluster(d.get("cluster"), k, where)
        schedule = d.get("schedule")
        if schedule is not None and schedule not in ("gpipe", "1f1b", "1f1b_flush"):
            raise PlanError(f"schedule {schedule!r} is not one of gpipe, 1f1b, 1f1b_flush", where=where)
        micro = d.get("microbatches")
        if micro is not None and (isinstance(micro, bool) or not isinstance(micro, int) or micro < 1):
            raise PlanError(f"microbatches = {micro!r} is not a positive integer", where=where)
        return cls(
            method=method,
            stage_of_node={str(n): int(s) for n, s in son.items()},
            device_of_stage=[int(x) for x in dos],
            objective=_num(d["objective"], "objective", where),
            comm_bytes=_num(d["comm_bytes"], "comm_bytes", where),
            search_s=_num(d.get("search_s", 0.0), "search_s", where),
            graph_name=str(d.get("graph_name", "")),
            extra=dict(extra),
            cluster=cluster,
            schedule=schedule,
            microbatches=micro,
            **lists,
        )

    @classmethod
    def from_json(cls, text: str, where: str = "plan") -> "PartitionPlan":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(
                f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}", where=where
            ) from None
        except RecursionError:
            raise PlanError("invalid JSON: nested too deeply", where=where) from None
        return cls.from_dict(d, where=where)

    def save(self, path: str) -> None:
        """Write the plan as JSON (atomically: a temp file then rename), with the permissions ``open``
        would give (0666 minus the umask, e.g. 0644; mkstemp's own are 0600)."""
        import os
        import tempfile

        d = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".plan-", suffix=".json")
        try:
            umask = os.umask(0o022)
            os.umask(umask)
            os.fchmod(fd, 0o666 & ~umask)
            with os.fdopen(fd, "w") as f:
                f.write(self.to_json(indent=1))
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: str) -> "PartitionPlan":
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise PlanError(f"cannot read plan: {e}", where=path) from None
        return cls.from_json(text, where=path)


def _num(x: Any, what: str, where: str) -> float:
    if (
        isinstance(x, bool)
        or not isinstance(x, (int, float))
        or not math.isfinite(float(x) if abs(x) < 1e308 else math.inf)
    ):
        raise PlanError(f"{what} = {str(x)[:40]} is not a finite number", where=where)
    return float(x)


def _cluster(c: Any, k: int, where: str) -> Optional[Dict[str, Any]]:
    """Validate a plan's ``cluster`` record (None stays None)."""
    if c is None:
        return None
    if not isinstance(c, Mapping):
        raise PlanError("cluster must be an object", where=where)
    caps = c.get("capacities")
    if not isinstance(caps, list) or len(caps) < k:
        raise PlanError(f"cluster.capacities must be a list of at least {k} numbers", where=where)
    caps = [_num(x, f"cluster.capacities[{i}]", where) for i, x in enumerate(caps)]
    if any(x <= 0 for x in caps):
        raise PlanError("cluster.capacities must be positive", where=where)
    n = len(caps)
    kinds = c.get("kinds", [None] * n)
    if (
        not isinstance(kinds, list)
        or len(kinds) != n
        or any(x is not None and not isinstance(x, str) for x in kinds)
    ):
        raise PlanError(f"cluster.kinds must be a list of {n} strings or nulls", where=where)
    mem = c.get("memory_bytes", [None] * n)
    if not isinstance(mem, list) or len(mem) != n:
        raise PlanError(f"cluster.memory_bytes must be a list of {n} numbers or nulls", where=where)
    mem = [None if x is None else _num(x, f"cluster.memory_bytes[{i}]", where) for i, x in enumerate(mem)]
    bw = _num(c.get("bandwidth_gbps", 10.0), "cluster.bandwidth_gbps", where)
    lat = _num(c.get("latency_ms", 0.0), "cluster.latency_ms", where)
    if bw <= 0 or lat < 0:
        raise PlanError("cluster.bandwidth_gbps must be > 0 and cluster.latency_ms >= 0", where=where)
    return {
        "capacities": caps,
        "kinds": list(kinds),
        "bandwidth_gbps": bw,
        "latency_ms": lat,
        "memory_bytes": mem,
    }


def single_stage_plan(graph: Any) -> PartitionPlan:
    """The whole graph (a :class:`~tf_commopt.core.costgraph.CostGraph`) as one stage on device 0."""
    t = graph.total_ms()
    son = {v: 0 for v in graph.topological_order()}
    return PartitionPlan("single", son, [0], [t], [0.0], [0.0], t, 0.0, graph_name=graph.name)


@dataclass(frozen=True)
class HybridPlan:
    """A grouped hybrid: pipelines inside device groups, data parallel between them.

    Attributes:
        groups: the cluster's device indices of each group.
        plans: one PartitionPlan per group (``device_of_stage`` indexes the group's devices).
        microbatches: GPipe micro-batches per group per mini-batch.
        group_ms: each group's pipeline alone on the whole mini-batch (ms, simulated by the planner).
        weights: each group's throughput for the batch split (default ``1 / group_ms``).
        stage_devices: ``[group][stage]``: the cluster devices of the stage's replicas (default: one
            replica, ``groups[g][plans[g].device_of_stage[s]]``).
        grouping: how the groups were formed (``"snake"``, ``"contiguous"``, ``"given"``,
            ``"replicated:<shape>"``).
    """

    groups: List[List[int]]
    plans: List[PartitionPlan]
    microbatches: int
    group_ms: List[float]
    weights: Optional[List[float]] = None
    stage_devices: Optional[List[List[Tuple[int, ...]]]] = None
    grouping: str = "given"

    def __post_init__(self):
        G = len(self.groups)
        if (
            len(self.plans) != G
            or len(self.group_ms) != G
            or (self.weights is not None and len(self.weights) != G)
        ):
            raise InputError(
                f"{len(self.plans)} plans, {len(self.group_ms)} group times for {G} groups",
                where="HybridPlan",
            )
        if (
            isinstance(self.microbatches, bool)
            or not isinstance(self.microbatches, int)
            or self.microbatches < 1
        ):
            raise InputError(
                f"microbatches must be a positive integer, got {self.microbatches!r}", where="microbatches"
            )

    @property
    def batch_fractions(self) -> List[float]:
        """Each group's share of the global batch: its weight over the sum (weights default ``1 / t_g``)."""
        w = self.weights if self.weights is not None else [1.0 / t for t in self.group_ms]
        if any(not x > 0 for x in w):
            raise InputError(f"group weights must be positive, got {list(w)}", where="HybridPlan")
        return [x / sum(w) for x in w]

    def devices_of_stage(self, g: int) -> List[Tuple[int, ...]]:
        """The cluster devices of each stage of group ``g`` (one tuple of replicas per stage)."""
        if self.stage_devices is not None:
            return [tuple(d) for d in self.stage_devices[g]]
        plan, group = self.plans[g], self.groups[g]
        return [(group[plan.device_of_stage[s]],) for s in range(plan.num_stages)]

    def with_weights(self, weights: Sequence[float]) -> "HybridPlan":
        """The same plan with the batch split by ``weights`` (one positive number per group)."""
        w = [float(x) for x in weights]
        if len(w) != len(self.groups) or any(not x > 0 for x in w):
            raise InputError(
                f"need {len(self.groups)} positive group weights, got {list(weights)}", where="group_weights"
            )
        return replace(self, weights=w)
