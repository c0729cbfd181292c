"""The one rule for a pipeline stage's compute and the bytes on each hop (shared by the partitioner's
objective, its pipeline model and the simulator).

Rules (stages ``0..K-1`` in pipeline order, stage ``s`` on device ``d(s)``):

* **compute**: ``forward(s) = sum_{v in s} fwd_k(v) / capacity(d(s))`` (backward alike), ``k`` the
  device's kind (per-kind costs of the CostGraph) or the graph's default costs;
* **hops**: node ``u``'s output travels from ``stage(u)`` to ``last(u)``, the largest stage of its
  consumers, over every hop ``h -> h+1`` with ``stage(u) <= h < last(u)`` (relayed hop by hop, counted
  once per hop however many consumers lie beyond); its gradient comes back over the same hops;
* **transfer**: one message of ``B`` bytes over a link takes ``latency + B / bandwidth``; ``B <= 1e-9``
  costs nothing (no message).

Example:
    >>> from tf_commopt.core.costgraph import CostGraph, Node
    >>> from tf_commopt.core.stagecost import hop_bytes, transfer_ms
    >>> g = CostGraph([Node("a", 1, 1, activation_bytes=10), Node("b", 1, 1, activation_bytes=3),
    ...                Node("c", 1, 1)], [("a", "b"), ("b", "c"), ("a", "c")])
    >>> hop_bytes(g, {"a": 0, "b": 1, "c": 2}, 3)      # a's output is relayed through stage 1
    [10.0, 13.0]
    >>> transfer_ms(2e6, bytes_per_ms=1e6, latency_ms=0.5)
    2.5
"""

from __future__ import annotations

from typing import List, Mapping, Sequence

import numpy as np

__all__ = ["hop_bytes", "hop_bytes_array", "transfer_ms", "EPS_BYTES"]

EPS_BYTES = 1e-9


def transfer_ms(nbytes: float, bytes_per_ms: float, latency_ms: float) -> float:
    """One message: ``latency + nbytes / bandwidth``; 0 for no bytes."""
    if nbytes <= EPS_BYTES:
        return 0.0
    return latency_ms + nbytes / bytes_per_ms


def hop_bytes_array(
    stage: np.ndarray, eu: np.ndarray, ev: np.ndarray, act: np.ndarray, num_stages: int
) -> List[float]:
    """Bytes on hops ``0..K-2`` (forward direction, per mini-batch) for integer arrays.

    ``stage[i]``: stage of node ``i``; ``eu[j] -> ev[j]``: the edges; ``act[i]``: bytes of node ``i``'s
    output. O(nodes + edges).
    """
    K = num_stages
    st = np.asarray(stage, dtype=np.int64)
    last = st.copy()
    if eu.size:
        np.maximum.at(last, eu, st[ev])
    w = np.where(last > st, act, 0.0)
    diff = np.bincount(st, weights=w, minlength=K + 1) - np.bincount(last, weights=w, minlength=K + 1)
    hop = np.cumsum(diff)[: max(K - 1, 0)]
    return [max(0.0, float(h)) for h in hop]


def hop_bytes(graph, stage_of_node: Mapping[str, int], num_stages: int) -> List[float]:
    """Bytes (per mini-batch, forward direction) crossing each boundary ``h -> h+1`` (see module rules)."""
    order: Sequence[str] = graph.topological_order()
    index = {n: i for i, n in enumerate(order)}
    eu = np.array([index[a] for a, _ in graph.edges], dtype=np.int64)
    ev = np.array([index[b] for _, b in graph.edges], dtype=np.int64)
    act = np.array([graph[v].activation_bytes for v in order], dtype=float)
    st = np.array([stage_of_node[v] for v in order], dtype=np.int64)
    return hop_bytes_array(st, eu, ev, act, num_stages)
