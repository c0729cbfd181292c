"""Contract an op-level CostGraph by name scope into a DAG of layers.

An op belongs to its name scope (``m/fc1/MatMul`` -> ``m/fc1``; a helper op scoped under another op,
``f/Reshape/shape`` under ``f/Reshape``, joins that op's scope); ``depth=k`` keeps the first k scope
components. Ops are taken in topological order; an op joins the latest part of its scope unless that
part already reaches (in the contracted graph) one of the op's producers' parts — joining would then
close a cycle, so a new part ``scope#k`` starts (one ``UserWarning`` lists the split scopes). The
contracted graph is a DAG by construction (every added part edge ``q -> P`` has no path ``P -> q``).
Costs and parameters are summed; a part's ``activation_bytes`` are the outputs of members consumed
outside it (or of its sinks).

Example:
    >>> scope_of("m/fc1/MatMul"), scope_of("m/fc1/MatMul", depth=1), scope_of("x")
    ('m/fc1', 'm', 'x')
"""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Dict, List, Optional, Set

from tf_commopt.core.costgraph import CostGraph, Node
from tf_commopt.tf.op_costs import _caller_stacklevel

__all__ = ["scope_of", "group_by_scope"]


def scope_of(op_name: str, depth: Optional[int] = None) -> str:
    """Name scope of an op: ``a/b/MatMul`` -> ``a/b`` (``depth=1`` -> ``a``); no scope -> the name."""
    parts = op_name.split("/")
    if len(parts) == 1:
        return op_name
    keep = len(parts) - 1 if depth is None else max(1, min(depth, len(parts) - 1))
    return "/".join(parts[:keep])


def _group_key(op_name: str, depth: Optional[int], op_names: Set[str]) -> str:
    """Scope of ``op_name``; a helper op scoped under another op belongs to that op's scope."""
    s = scope_of(op_name)
    while s != op_name and s in op_names and "/" in s:
        s = scope_of(s)
    if depth is not None and s.count("/") + 1 > depth:
        s = "/".join(s.split("/")[: max(1, depth)])
    return s


class _Parts:
    """The parts being built: their labels, members, successors, and the latest part of each scope."""

    def __init__(self) -> None:
        self.part_of: Dict[str, int] = {}
        self.names: List[str] = []
        self.members: List[List[str]] = []
        self.succ: List[Set[int]] = []
        self.latest: Dict[str, int] = {}
        self.count: Counter = Counter()
        self.used: Set[str] = set()
        self.splits: Counter = Counter()

    def reaches(self, a: int, b: int) -> bool:
        stack, seen = [a], {a}
        while stack:
            x = stack.pop()
            if x == b:
                return True
            for y in self.succ[x]:
                if y not in seen:
                    seen.add(y)
                    stack.append(y)
        return False

    def new_part(self, scope: str) -> int:
        if scope in self.latest:
            self.splits[scope] += 1
        self.count[scope] += 1
        label = scope if self.count[scope] == 1 else f"{scope}#{self.count[scope]}"
        k = 2
        while label in self.used:
            label, k = f"{scope}#{self.count[scope]}.{k}", k + 1
        self.used.add(label)
        self.names.append(label)
        self.members.append([])
        self.succ.append(set())
        self.latest[scope] = len(self.names) - 1
        return self.latest[scope]

    def add(self, op: str, scope: str, pred_parts: Set[int]) -> None:
        P = self.latest.get(scope)
        if P is None or any(q != P and self.reaches(P, q) for q in pred_parts):
            P = self.new_part(scope)
        self.part_of[op] = P
        self.members[P].append(op)
        for q in pred_parts:
            if q != P:
                self.succ[q].add(P)


def _part_node(op_graph: CostGraph, parts: _Parts, P: int) -> Node:
    ms = parts.members[P]
    leaving = [m for m in ms if any(parts.part_of[w] != P for w in op_graph.successors(m))]
    sinks = [m for m in ms if not op_graph.successors(m)]
    types = list(dict.fromkeys(op_graph[m].label for m in ms))
    return Node(
        parts.names[P],
        sum(op_graph[m].forward_ms for m in ms),
        sum(op_graph[m].backward_ms for m in ms),
        sum(op_graph[m].param_bytes for m in ms),
        sum(op_graph[m].activation_bytes for m in (leaving or sinks)),
        "+".join(types[:4]) + ("+..." if len(types) > 4 else ""),
    )


def group_by_scope(op_graph: CostGraph, depth: Optional[int], name: str, op_names: Set[str]) -> CostGraph:
    """The scope-contracted DAG of ``op_graph`` (see the module docstring).

    Args:
        op_graph: the op-level graph.
        depth: scope components kept (None: all).
        name: the result's name.
        op_names: every op name of the original graph (to find helper ops scoped under an op).
    """
    parts = _Parts()
    for v in op_graph.topological_order():
        pred_parts = {parts.part_of[u] for u in op_graph.predecessors(v)}
        parts.add(v, _group_key(v, depth, op_names), pred_parts)
    if parts.splits:
        warnings.warn(
            f"{name or 'graph'}: {len(parts.splits)} name scope(s) split to keep the grouped graph "
            f"acyclic: " + ", ".join(f"{s} ({k + 1} parts)" for s, k in sorted(parts.splits.items())),
            UserWarning,
            stacklevel=_caller_stacklevel(),
        )
    nodes = [_part_node(op_graph, parts, P) for P in range(len(parts.names))]
    pn, po = parts.names, parts.part_of
    edges = [(pn[po[a]], pn[po[b]]) for a, b in op_graph.edges if po[a] != po[b]]
    return CostGraph(nodes, edges, name=name)
