"""PartitionPlan: the plain value a partitioner returns and strategies/simulators consume.

Example:
    >>> from tf_commopt.core.partition.plan import PartitionPlan
    >>> p = PartitionPlan(method="balanced", stage_of_node={"a": 0, "b": 1}, device_of_stage=[0, 1],
    ...                   stage_compute_ms=[3.0, 2.0], stage_comm_ms=[0.5, 0.5],
    ...                   stage_memory_bytes=[0.0, 0.0], objective=3.5, comm_bytes=1e6)
    >>> p.num_stages, p.max_stage_ms
    (2, 3.5)
    >>> PartitionPlan.from_json(p.to_json()) == p
    True
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from tf_commopt.errors import PlanError

__all__ = ["PartitionPlan"]


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
        required = ["method", "stage_of_node", "device_of_stage", "stage_compute_ms", "stage_comm_ms",
                    "stage_memory_bytes", "objective", "comm_bytes"]
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
        return cls(
            method=method,
            stage_of_node={str(n): int(s) for n, s in son.items()},
            device_of_stage=[int(x) for x in dos],
            objective=_num(d["objective"], "objective", where),
            comm_bytes=_num(d["comm_bytes"], "comm_bytes", where),
            search_s=_num(d.get("search_s", 0.0), "search_s", where),
            graph_name=str(d.get("graph_name", "")),
            extra=dict(extra),
            **lists,
        )

    @classmethod
    def from_json(cls, text: str, where: str = "plan") -> "PartitionPlan":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}", where=where) from None
        except RecursionError:
            raise PlanError("invalid JSON: nested too deeply", where=where) from None
        return cls.from_dict(d, where=where)

    def save(self, path: str) -> None:
        """Write the plan as JSON (atomically: a temp file then rename)."""
        import os
        import tempfile

        d = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".plan-", suffix=".json")
        try:
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
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(float(x) if abs(x) < 1e308 else math.inf):
        raise PlanError(f"{what} = {str(x)[:40]} is not a finite number", where=where)
    return float(x)
