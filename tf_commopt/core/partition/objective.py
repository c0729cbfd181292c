"""The one objective every partition method is scored by.

Example:
    >>> from tf_commopt.core.costgraph import CostGraph, Node
    >>> from tf_commopt.core.devices import Cluster
    >>> from tf_commopt.core.partition.objective import Problem
    >>> g = CostGraph([Node("a", 1, 2, activation_bytes=1.25e6), Node("b", 2, 2)], [("a", "b")])
    >>> p = Problem(g, Cluster.homogeneous(2, bandwidth_gbps=10.0), num_stages=2)
    >>> ev = p.evaluate([0, 1], [0, 1])          # stage of each node (topological order), device of each stage
    >>> ev.stage_compute_ms, ev.stage_comm_ms, ev.comm_bytes
    ([3.0, 4.0], [2.0, 0.0], 2500000.0)

The exact rule (stages ``0..K-1`` in pipeline order, stage ``s`` on device ``d(s)``):

* **Convexity**: every edge ``u -> v`` has ``stage(u) <= stage(v)`` and no stage is empty. (Then the
  stages are ordered and the quotient graph has no cycle.)
* **Compute**: ``compute(s) = sum_{v in s} (fwd_k(v) + bwd_k(v)) / capacity(d(s))`` with ``k`` the
  device's kind (per-kind costs of the CostGraph) or the graph's default costs.
* **Hops**: node ``u``'s output tensor travels from ``stage(u)`` to ``last(u)``, the largest stage of its
  consumers, over every hop ``h -> h+1`` with ``stage(u) <= h < last(u)`` (skip connections are relayed
  hop by hop; a tensor is counted once per hop however many consumers lie beyond). ``B(h)`` is the bytes
  on hop ``h``.
* **Communication**: stage ``s`` sends its outgoing activations and receives the gradients coming back:
  ``comm(s) = 2 * (latency + B(s) / bandwidth(d(s), d(s+1)))`` if ``B(s) > 0`` else 0 (the last stage
  has no outgoing hop).
* **Memory**: ``mem(s) = V(s) * params(s) + (K - s) * activations(s)`` (1F1B keeps up to ``K - s``
  micro-batches' activations stashed on stage ``s``; ``V(s) = K - s`` stashed weight versions with
  ``Problem(..., stash_weights=True)``, i.e. when partitioning for the asynchronous 1F1B schedule, else 1). Over a device's cap, stage ``s`` pays
  ``penalty(s) = P * (mem(s) - cap) / cap`` with ``P = 1000 * (1 + total compute ms / smallest
  capacity)``, so any plan that fits beats any plan that does not.
* **Objective** (minimised): ``max_s compute(s) + comm(s) + penalty(s)``. ``comm_bytes = 2 * sum_h B(h)``
  (forward activations plus backward gradients per mini-batch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Union

import numpy as np

from tf_commopt.core.costgraph import CostGraph
from tf_commopt.core.devices import Cluster
from tf_commopt.core.stagecost import hop_bytes_array, transfer_ms
from tf_commopt.errors import InputError, PlanError

__all__ = ["Problem", "Evaluation"]


@dataclass
class Evaluation:
    """Costs of one plan under :class:`Problem`'s objective."""

    stage_compute_ms: List[float]
    stage_comm_ms: List[float]
    stage_penalty_ms: List[float]
    hop_bytes: List[float]
    stage_memory_bytes: List[float]
    objective: float
    comm_bytes: float

    @property
    def stage_ms(self) -> List[float]:
        return [c + m for c, m in zip(self.stage_compute_ms, self.stage_comm_ms)]

    @property
    def max_stage_ms(self) -> float:
        return max(self.stage_ms)

    @property
    def feasible(self) -> bool:
        return not any(p > 0 for p in self.stage_penalty_ms)


class Problem:
    """A graph, a cluster and a stage count, pre-digested into arrays (node ``i`` = ``order[i]``).

    Args:
        graph: the CostGraph.
        cluster: devices (capacity, kind, memory) and links; needs ``>= num_stages`` devices.
        num_stages: K.
        memory: optional memory cap in bytes for every device (a number) or per device (a list);
            overrides the devices' own ``memory_bytes`` where given.
        stash_weights: count 1F1B's stashed weight versions in the memory model (stage ``s`` holds
            ``K - s`` versions of its parameters, one per micro-batch in flight).
    """

    def __init__(
        self,
        graph: CostGraph,
        cluster: Cluster,
        num_stages: int,
        memory: Union[None, float, Sequence[Optional[float]]] = None,
        stash_weights: bool = False,
    ):
        if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
            raise InputError(f"number of stages must be a positive integer, got {num_stages!r}")
        if num_stages > len(graph):
            raise InputError(f"{num_stages} stages for a graph of {len(graph)} nodes")
        if num_stages > len(cluster):
            raise InputError(f"{num_stages} stages need at least as many devices; cluster has {len(cluster)}")
        self.graph, self.cluster, self.K = graph, cluster, num_stages
        self.stash_weights = bool(stash_weights)
        # weight versions held by stage s: 1, or K - s with 1F1B's weight stashing (one per micro-batch in flight)
        self.weight_versions: List[int] = [num_stages - s if stash_weights else 1 for s in range(num_stages)]
        self.order: List[str] = graph.topological_order()
        self.index = {n: i for i, n in enumerate(self.order)}
        n = self.n = len(self.order)
        self.succ: List[List[int]] = [[self.index[s] for s in graph.successors(v)] for v in self.order]
        self.pred: List[List[int]] = [[self.index[p] for p in graph.predecessors(v)] for v in self.order]
        eu = [u for u in range(n) for _ in self.succ[u]]
        ev = [v for u in range(n) for v in self.succ[u]]
        self.eu, self.ev = np.array(eu, dtype=np.int64), np.array(ev, dtype=np.int64)
        self.act = np.array([graph[v].activation_bytes for v in self.order], dtype=float)
        self.param = np.array([graph[v].param_bytes for v in self.order], dtype=float)
        self.has_succ = np.array([bool(s) for s in self.succ])
        D = len(cluster)
        self.D = D
        kinds: List[Optional[str]] = []
        for d in cluster.devices:
            if d.kind not in kinds:
                kinds.append(d.kind)
        self.kinds = kinds
        self.kind_of_dev = [kinds.index(d.kind) for d in cluster.devices]
        self.fwd = np.array([[graph.forward_ms(v, k) for v in self.order] for k in kinds], dtype=float)
        self.comp = self.fwd + np.array(
            [[graph.backward_ms(v, k) for v in self.order] for k in kinds], dtype=float
        )
        self.cap = [float(d.capacity) for d in cluster.devices]
        # plain-list copies for the incremental (pure Python) evaluation of local search
        self.comp_lists: List[List[float]] = [row.tolist() for row in self.comp]
        self.fwd_lists: List[List[float]] = [row.tolist() for row in self.fwd]
        self.act_list: List[float] = self.act.tolist()
        self.param_list: List[float] = self.param.tolist()
        if memory is None:
            caps = [d.memory_bytes for d in cluster.devices]
        elif isinstance(memory, (int, float)) and not isinstance(memory, bool):
            caps = [float(memory)] * D
        else:
            caps = list(memory)
            if len(caps) != D:
                raise InputError(f"{len(caps)} memory caps for {D} devices", where="memory")
        for c in caps:
            if c is not None and not (isinstance(c, (int, float)) and math.isfinite(c) and c > 0):
                raise InputError(f"memory cap must be a positive number of bytes, got {c!r}", where="memory")
        self.mem_cap: List[Optional[float]] = [None if c is None else float(c) for c in caps]
        self.bpm = [[cluster.link(a, b).bytes_per_ms for b in range(D)] for a in range(D)]
        self.lat = [[cluster.link(a, b).latency_ms for b in range(D)] for a in range(D)]
        self.penalty_factor = 1000.0 * (1.0 + float(self.comp.sum(axis=1).max()) / min(self.cap))

    # ------------------------------------------------------------------ pieces
    def comm_ms(self, nbytes: float, da: int, db: int) -> float:
        """Time charged to the sending stage for ``nbytes`` activations out and their gradients back."""
        return 2.0 * transfer_ms(nbytes, self.bpm[da][db], self.lat[da][db])

    def penalty_ms(self, mem: float, dev: int) -> float:
        cap = self.mem_cap[dev]
        if cap is None or mem <= cap:
            return 0.0
        return self.penalty_factor * (mem - cap) / cap

    # ------------------------------------------------------------------ checks
    def check(self, stage: Sequence[int], devs: Sequence[int]) -> None:
        """Raise PlanError unless ``stage`` is a convex, complete K-stage assignment on distinct devices."""
        st = np.asarray(stage)
        if st.shape != (self.n,):
            raise PlanError(f"plan has {st.shape[0] if st.ndim else 0} node stages for {self.n} nodes")
        if len(devs) != self.K or len(set(devs)) != self.K or any(not 0 <= d < self.D for d in devs):
            raise PlanError(
                f"device_of_stage {list(devs)} must be {self.K} distinct devices in [0, {self.D})"
            )
        if st.min() < 0 or st.max() >= self.K:
            raise PlanError(f"stage out of range [0, {self.K})")
        bad = np.nonzero(st[self.eu] > st[self.ev])[0]
        if bad.size:
            u, v = self.order[self.eu[bad[0]]], self.order[self.ev[bad[0]]]
            raise PlanError(
                f"not convex: edge {u!r} -> {v!r} goes from stage {st[self.eu[bad[0]]]} "
                f"back to stage {st[self.ev[bad[0]]]}"
            )
        counts = np.bincount(st, minlength=self.K)
        if (counts == 0).any():
            raise PlanError(f"stage {int(np.argmin(counts))} is empty")

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, stage: Sequence[int], devs: Sequence[int]) -> Evaluation:
        """Full evaluation (numpy, O(nodes + edges)) of a convex assignment."""
        K = self.K
        st = np.asarray(stage, dtype=np.int64)
        per_kind = [np.bincount(st, weights=self.comp[k], minlength=K) for k in range(len(self.kinds))]
        compute = [float(per_kind[self.kind_of_dev[d]][s]) / self.cap[d] for s, d in enumerate(devs)]
        hop = hop_bytes_array(st, self.eu, self.ev, self.act, K) + [0.0]
        comm = [self.comm_ms(hop[s], devs[s], devs[s + 1]) if s < K - 1 else 0.0 for s in range(K)]
        par = np.bincount(st, weights=self.param, minlength=K)
        acts = np.bincount(st, weights=self.act, minlength=K)
        mem = [float(self.weight_versions[s] * par[s] + (K - s) * acts[s]) for s in range(K)]
        pen = [self.penalty_ms(mem[s], devs[s]) for s in range(K)]
        obj = max(c + m + p for c, m, p in zip(compute, comm, pen))
        return Evaluation(compute, comm, pen, hop, mem, obj, 2.0 * sum(hop))

    def objective(self, stage: Sequence[int], devs: Sequence[int]) -> float:
        return self.evaluate(stage, devs).objective

    def default_devices(self) -> List[int]:
        """Devices for the K stages when the caller gives no order: the K fastest, in cluster order."""
        ranked = sorted(range(self.D), key=lambda d: (-self.cap[d], d))[: self.K]
        return sorted(ranked)
