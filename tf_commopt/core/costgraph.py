"""CostGraph: a model as a DAG of layers (or ops) with their training costs.

Each node carries the forward and backward time of one mini-batch at the profiled batch size
(milliseconds), the bytes of its parameters and the bytes of its output activation. An edge
``(a, b)`` means ``b`` consumes ``a``'s output. Optional per-device-kind costs record that real
devices do not speed up every layer alike (e.g. convolutions 3x faster in bf16, BatchNorm not).

Example:
    >>> from tf_commopt.core.costgraph import CostGraph, Node
    >>> g = CostGraph(
    ...     [Node("conv", 2.0, 4.0, param_bytes=1e6, activation_bytes=4e6),
    ...      Node("relu", 0.5, 0.5, activation_bytes=4e6),
    ...      Node("add", 0.1, 0.1, activation_bytes=4e6)],
    ...     [("conv", "relu"), ("relu", "add"), ("conv", "add")])
    >>> g.topological_order()
    ['conv', 'relu', 'add']
    >>> g.total_ms()
    7.2
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from tf_commopt.errors import GraphError

__all__ = ["Node", "CostGraph"]


@dataclass(frozen=True)
class Node:
    """One layer or op of a model.

    Attributes:
        name: unique node name.
        forward_ms: forward time of one mini-batch at the profiled batch size (ms).
        backward_ms: backward time of one mini-batch (ms).
        param_bytes: bytes of the node's trainable parameters.
        activation_bytes: bytes of the node's output for one mini-batch.
        label: free text (layer type, op type) shown in reports.
    """

    name: str
    forward_ms: float
    backward_ms: float
    param_bytes: float = 0.0
    activation_bytes: float = 0.0
    label: str = ""

    @property
    def compute_ms(self) -> float:
        """Forward plus backward time (ms)."""
        return self.forward_ms + self.backward_ms


def _check_number(value: object, what: str, where: str) -> float:
    if isinstance(value, bool):  # float(True) == 1.0 would pass silently
        raise GraphError(f"{what} is not a number: {value!r}", where=where)
    try:
        x = float(value)  # type: ignore[arg-type]
    except OverflowError:  # an int beyond float range
        raise GraphError(f"{what} is not finite: {str(value)[:20]}...", where=where) from None
    except (TypeError, ValueError):
        raise GraphError(f"{what} is not a number: {value!r}", where=where) from None
    if not math.isfinite(x):
        raise GraphError(f"{what} is not finite: {value!r}", where=where)
    if x < 0:
        raise GraphError(f"{what} is negative: {value!r}", where=where)
    return x


class CostGraph:
    """A validated DAG of :class:`Node` with data-dependency edges.

    Args:
        nodes: the nodes, in any order (their order breaks ties in the topological order).
        edges: ``(producer, consumer)`` name pairs; duplicates are merged.
        name: a label for reports.
        sources: optional ``{node name: "file:line"}`` used to say where a bad node came from.

    Raises:
        GraphError: empty graph, duplicate names, bad numbers, unknown endpoints, self loops or cycles.
    """

    def __init__(
        self,
        nodes: Iterable[Node],
        edges: Iterable[Tuple[str, str]],
        name: str = "",
        sources: Optional[Mapping[str, str]] = None,
    ):
        self.name = name
        self._sources: Dict[str, str] = dict(sources or {})
        self._nodes: Dict[str, Node] = {}
        for n in nodes:
            where = self._sources.get(getattr(n, "name", ""), None)
            if not isinstance(n, Node):
                raise GraphError(f"not a Node: {n!r}", where=where)
            if not isinstance(n.name, str) or not n.name:
                raise GraphError(f"node name must be a non-empty string, got {n.name!r}", where=where)
            where = where or f"node {n.name!r}"
            if n.name in self._nodes:
                raise GraphError(f"duplicate node name {n.name!r}", where=where)
            checked = replace(
                n,
                forward_ms=_check_number(n.forward_ms, "forward_ms", where),
                backward_ms=_check_number(n.backward_ms, "backward_ms", where),
                param_bytes=_check_number(n.param_bytes, "param_bytes", where),
                activation_bytes=_check_number(n.activation_bytes, "activation_bytes", where),
            )
            self._nodes[n.name] = checked
        if not self._nodes:
            raise GraphError("empty graph: no nodes", where=name or None)
        self._succ: Dict[str, List[str]] = {k: [] for k in self._nodes}
        self._pred: Dict[str, List[str]] = {k: [] for k in self._nodes}
        seen = set()
        self._edges: List[Tuple[str, str]] = []
        for e in edges:
            try:
                a, b = e
            except (TypeError, ValueError):
                raise GraphError(f"edge must be a (producer, consumer) pair, got {e!r}") from None
            where = self._sources.get(f"{a}->{b}") or f"edge {a!r} -> {b!r}"
            for end in (a, b):
                if end not in self._nodes:
                    raise GraphError(f"unknown node {end!r}", where=where)
            if a == b:
                raise GraphError("self loop", where=where)
            if (a, b) in seen:
                continue
            seen.add((a, b))
            self._edges.append((a, b))
            self._succ[a].append(b)
            self._pred[b].append(a)
        self._topo = self._compute_topological_order()
        self._index = {n: i for i, n in enumerate(self._topo)}
        self._kinds: Dict[str, Dict[str, Tuple[float, float]]] = {}

    # ----------------------------------------------------------------- structure
    def _compute_topological_order(self) -> List[str]:
        order_of = {n: i for i, n in enumerate(self._nodes)}
        indeg = {n: len(p) for n, p in self._pred.items()}
        import heapq

        heap = [(order_of[n], n) for n, d in indeg.items() if d == 0]
        heapq.heapify(heap)
        out: List[str] = []
        while heap:
            _, n = heapq.heappop(heap)
            out.append(n)
            for s in self._succ[n]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    heapq.heappush(heap, (order_of[s], s))
        if len(out) != len(self._nodes):
            stuck = [n for n, d in indeg.items() if d > 0]
            cycle = self._find_cycle(set(stuck))
            raise GraphError(
                "cycle: " + " -> ".join(cycle), where=self._sources.get(cycle[0]) or f"node {cycle[0]!r}"
            )
        return out

    def _find_cycle(self, candidates: set) -> List[str]:
        start = min(candidates, key=lambda n: list(self._nodes).index(n))
        path, pos, n = [], {}, start
        while n not in pos:
            pos[n] = len(path)
            path.append(n)
            n = next(p for p in self._pred[n] if p in candidates)
        cyc = path[pos[n] :]
        cyc.reverse()
        return cyc + [cyc[0]]

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, name: object) -> bool:
        return name in self._nodes

    def __iter__(self) -> Iterator[str]:
        return iter(self._topo)

    def __getitem__(self, name: str) -> Node:
        return self._nodes[name]

    @property
    def nodes(self) -> Mapping[str, Node]:
        """Nodes by name, in input order."""
        return self._nodes

    @property
    def edges(self) -> Sequence[Tuple[str, str]]:
        """``(producer, consumer)`` pairs, duplicates removed, in input order."""
        return tuple(self._edges)

    def predecessors(self, name: str) -> Sequence[str]:
        return self._pred[name]

    def successors(self, name: str) -> Sequence[str]:
        return self._succ[name]

    def topological_order(self) -> List[str]:
        """A deterministic topological order (ties broken by input order)."""
        return list(self._topo)

    def topo_index(self, name: str) -> int:
        """Position of ``name`` in :meth:`topological_order`."""
        return self._index[name]

    def sources_of(self, name: str) -> Optional[str]:
        """Where a node was read from (``file:line``) if known."""
        return self._sources.get(name)

    def to_networkx(self):
        """The graph as a ``networkx.DiGraph`` with node attributes from :class:`Node`."""
        import networkx as nx

        g = nx.DiGraph(name=self.name)
        for n in self._topo:
            node = self._nodes[n]
            g.add_node(
                n,
                forward_ms=node.forward_ms,
                backward_ms=node.backward_ms,
                param_bytes=node.param_bytes,
                activation_bytes=node.activation_bytes,
                label=node.label,
            )
        g.add_edges_from(self._edges)
        return g

    # ----------------------------------------------------------------- costs
    def total_ms(self, kind: Optional[str] = None) -> float:
        """Sum of forward+backward time over all nodes (for device kind ``kind`` if given)."""
        return sum(self.compute_ms(n, kind) for n in self._nodes)

    def total_param_bytes(self) -> float:
        return sum(n.param_bytes for n in self._nodes.values())

    @property
    def kinds(self) -> List[str]:
        """Device kinds with their own per-node costs (see :meth:`add_kind`)."""
        return list(self._kinds)

    def add_kind(self, kind: str, costs: Mapping[str, Tuple[float, float]]) -> None:
        """Record per-node (forward_ms, backward_ms) measured on device kind ``kind``.

        Every node must be present; the default costs stay those of the nodes themselves.
        """
        missing = [n for n in self._nodes if n not in costs]
        if missing:
            raise GraphError(f"kind {kind!r} lacks costs for {len(missing)} node(s), first {missing[0]!r}")
        extra = [n for n in costs if n not in self._nodes]
        if extra:
            raise GraphError(f"kind {kind!r} has costs for unknown node {extra[0]!r}")
        table = {}
        for n, (f, b) in costs.items():
            where = f"kind {kind!r} node {n!r}"
            table[n] = (_check_number(f, "forward_ms", where), _check_number(b, "backward_ms", where))
        self._kinds[kind] = table

    def forward_ms(self, name: str, kind: Optional[str] = None) -> float:
        if kind is not None and kind in self._kinds:
            return self._kinds[kind][name][0]
        if kind is not None and kind not in self._kinds:
            raise GraphError(f"unknown device kind {kind!r}; graph has {sorted(self._kinds) or 'none'}")
        return self._nodes[name].forward_ms

    def backward_ms(self, name: str, kind: Optional[str] = None) -> float:
        if kind is not None and kind in self._kinds:
            return self._kinds[kind][name][1]
        if kind is not None and kind not in self._kinds:
            raise GraphError(f"unknown device kind {kind!r}; graph has {sorted(self._kinds) or 'none'}")
        return self._nodes[name].backward_ms

    def compute_ms(self, name: str, kind: Optional[str] = None) -> float:
        return self.forward_ms(name, kind) + self.backward_ms(name, kind)

    def __repr__(self) -> str:
        return f"CostGraph({self.name!r}, nodes={len(self._nodes)}, edges={len(self._edges)})"
