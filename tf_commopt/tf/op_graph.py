"""A GraphDef as an op-level CostGraph, optionally contracted by name scope into a DAG of layers.

Rules:

* Plumbing ops (:data:`~tf_commopt.tf.op_costs.PLUMBING_OPS`: Const, Identity, NoOp,
  ReadVariableOp...) and resource/variant Placeholders are dropped; an edge ``a -> b`` is kept
  when ``b`` consumes a tensor that ``a`` produces directly or through plumbing only. Control
  inputs are ignored (they carry no data); ``NextIteration`` back edges of TF1 loops are cut.
* Floating-point tensors of rank >= 1 that come from constants or variable reads (through
  plumbing only) are parameters: their bytes go to the first consuming op (each source once).
* Training graphs (:mod:`tf_commopt.tf.train_graph`): only forward ops become nodes; each node's
  backward is the cost of the gradient and optimizer ops attributed to it.
* Before import: :mod:`tf_commopt.tf.graphdef_prep` (batch size, input shapes, shaped variable
  reads); after: :mod:`tf_commopt.tf.shape_check` (no silent unknown shapes); grouping:
  :mod:`tf_commopt.tf.scope_group`.

Example:
    >>> g = graph_def_to_costgraph(cf.graph.as_graph_def(), group_by_scope=True,   # doctest: +SKIP
    ...                            scope_depth=None, batch_size=None, roofline=Roofline(),
    ...                            unknown_flops="elements", name="f", source=None)
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any, Dict, List, Optional, Set, Tuple

import tensorflow as tf

from tf_commopt.core.costgraph import CostGraph, Node
from tf_commopt.errors import InputError
from tf_commopt.tf.graphdef_prep import shape_variable_reads, with_batch, with_input_shapes
from tf_commopt.tf.op_costs import (
    FREE_OPS,
    PARAM_SOURCES,
    PLUMBING_OPS,
    Roofline,
    op_flops,
    tensor_bytes,
    warn_unknown,
)
from tf_commopt.tf.scope_group import group_by_scope as _group_by_scope
from tf_commopt.tf.scope_group import scope_of
from tf_commopt.tf.shape_check import check_shapes
from tf_commopt.tf.train_graph import attribute, classify

__all__ = ["graph_def_to_costgraph", "scope_of"]


def _is_plumbing(op: Any) -> bool:
    if op.type in PLUMBING_OPS:
        return True
    if op.type == "Placeholder":
        return op.outputs[0].dtype in (tf.resource, tf.variant)
    return False


def _import(graph_def: Any, where: str) -> tf.Graph:
    g = tf.Graph()
    try:
        with g.as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
    except Exception as e:  # invalid graph: missing inputs, unknown ops, bad attrs
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"cannot import the GraphDef: {first}", where=where) from None
    return g


class _OpCosting:
    """Nodes and data edges of the kept ops of an imported graph (see the module docstring)."""

    def __init__(
        self,
        g: tf.Graph,
        kind: Dict[str, str],
        kept: List[Any],
        var_reads: Dict[str, str],
        roofline: Roofline,
        unknown_flops: str,
    ):
        self.g, self.kind, self.kept, self.var_reads = g, kind, kept, var_reads
        self.roofline, self.unknown_flops = roofline, unknown_flops
        self.kept_names = {op.name for op in kept}
        self.training = any(k == "gradient" for k in kind.values())
        self.memo: Dict[str, Tuple[frozenset, Optional[str]]] = {}
        self.counted: Set[str] = set()
        self.var_owner: Dict[str, str] = {}  # parameter root -> the op holding its bytes
        self.unknown: List[str] = []  # op types without FLOP statistics
        self.pending: List[Tuple[str, float]] = []  # training graphs: (gradient/optimizer op, ms)
        self.nodes: List[Node] = []
        self.edges: List[Tuple[str, str]] = []

    def resolve(self, op: Any) -> Tuple[frozenset, Optional[str]]:
        """Kept ops reached upward from dropped ``op`` through plumbing, and its parameter root (if any)."""
        memo = self.memo
        if op.name in memo:
            return memo[op.name]
        memo[op.name] = (frozenset(), None)  # guards against cycles through plumbing
        if op.type == "NextIteration":
            return memo[op.name]
        if op.name in self.var_reads:
            memo[op.name] = (frozenset(), self.var_reads[op.name])
            return memo[op.name]
        if op.type in PARAM_SOURCES and op.type != "ReadVariableOp" or op.type == "Placeholder":
            memo[op.name] = (frozenset(), op.name)
            return memo[op.name]
        found: Set[str] = set()
        root: Optional[str] = None
        for t in op.inputs:
            if t.op.name in self.kept_names:
                found.add(t.op.name)
                continue
            sub, sub_root = self.resolve(t.op)
            found |= sub
            root = root or sub_root
        memo[op.name] = (frozenset(found), None if found else root)
        return memo[op.name]

    def _forward(self, name: str) -> bool:
        return not self.training or self.kind[name] == "forward"

    def _inputs(self, op: Any, is_fwd: bool) -> Tuple[float, float]:
        """(parameter bytes, bytes read) of ``op``; records its data edges when it is a forward op."""
        params, moved = 0.0, 0.0
        for t in op.inputs:
            b, _ = tensor_bytes(t)
            moved += 0.0 if op.type in FREE_OPS else b
            p = t.op
            if p.name in self.kept_names:
                if is_fwd and self._forward(p.name):
                    self.edges.append((p.name, op.name))
                continue
            ups, root = self.resolve(p)
            if not is_fwd:
                continue
            self.edges.extend((u, op.name) for u in sorted(ups) if self._forward(u))
            if root is not None and root not in self.counted and t.dtype.is_floating and t.shape.rank:
                self.counted.add(root)
                self.var_owner[root] = op.name
                params += b
        return params, moved

    def _cost(self, op: Any) -> None:
        is_fwd = self._forward(op.name)
        params, moved = self._inputs(op, is_fwd)
        out_bytes = sum(tensor_bytes(t)[0] for t in op.outputs)
        if op.type == "Placeholder":
            self.nodes.append(Node(op.name, 0.0, 0.0, 0.0, out_bytes, op.type))
            return
        flops, known = op_flops(self.g, op, self.unknown_flops)
        if not known:
            self.unknown.append(op.type)
        fwd = self.roofline.forward_ms(flops, 0.0 if op.type in FREE_OPS else moved + out_bytes)
        if not is_fwd:
            self.pending.append((op.name, fwd))
            return
        bwd = 0.0 if self.training else self.roofline.backward_ms(fwd)
        self.nodes.append(Node(op.name, fwd, bwd, params, out_bytes, op.type))

    def _up(self, op: Any) -> Set[str]:
        return {op.name} if op.name in self.kept_names else set(self.resolve(op)[0])

    def _attribute_backward(self, ops: List[Any]) -> List[Node]:
        """Each forward node's backward = the times of the gradient and optimizer ops attributed to it
        (:mod:`tf_commopt.tf.train_graph`); ops tied to nothing go to the last node."""
        nodes = self.nodes
        forward = [n.name for n in nodes if n.label != "Placeholder"]
        owners = dict(self.var_owner)
        owners.update({r: self.var_owner[h] for r, h in self.var_reads.items() if h in self.var_owner})
        owner = attribute(ops, self.kind, forward, owners, self._up, reads=self.var_reads)
        bwd: Counter = Counter()
        for name, ms in self.pending:
            o = owner.get(name)
            bwd[o if o is not None else (forward[-1] if forward else nodes[-1].name)] += ms
        return [
            Node(n.name, n.forward_ms, bwd.get(n.name, 0.0), n.param_bytes, n.activation_bytes, n.label)
            for n in nodes
        ]

    def run(self, ops: List[Any]) -> Tuple[List[Node], List[Tuple[str, str]]]:
        """Cost every kept op; ``ops`` are all ops of the graph (for backward attribution)."""
        for op in self.kept:
            self._cost(op)
        nodes = self._attribute_backward(ops) if self.training else self.nodes
        return nodes, self.edges


def _check_batch_size(batch_size: Optional[int]) -> None:
    if batch_size is not None and (
        isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0
    ):
        raise InputError(f"batch_size must be a positive integer, got {batch_size!r}", where="batch_size")


def graph_def_to_costgraph(
    graph_def: Any,
    *,
    group_by_scope: bool,
    scope_depth: Optional[int],
    batch_size: Optional[int],
    roofline: Roofline,
    unknown_flops: str,
    name: str,
    source: Optional[str],
    unknown_shapes: str = "error",
    input_shapes: Optional[Dict[str, Any]] = None,
) -> CostGraph:
    """See :func:`tf_commopt.tf.graph_import.from_graph_def` (same arguments)."""
    where = source or (f"graph {name!r}" if name else "GraphDef")
    _check_batch_size(batch_size)
    graph_def = with_batch(graph_def, batch_size) if batch_size is not None else copy.deepcopy(graph_def)
    if input_shapes:
        graph_def = with_input_shapes(graph_def, dict(input_shapes))
    var_reads = shape_variable_reads(graph_def)
    g = _import(graph_def, where)
    ops = g.get_operations()
    kind = classify(ops)
    kept = [op for op in ops if not (op.name in var_reads or _is_plumbing(op) or kind[op.name] == "dead")]
    if not kept:
        raise InputError("no computational ops in the graph (only constants/plumbing)", where=where)
    check_shapes(kept, unknown_shapes, where)
    costing = _OpCosting(g, kind, kept, var_reads, roofline, unknown_flops)
    nodes, edges = costing.run(ops)
    warn_unknown(costing.unknown, unknown_flops, where=where)
    op_graph = CostGraph(nodes, edges, name=name)
    if not group_by_scope:
        return op_graph
    return _group_by_scope(op_graph, scope_depth, name, {op.name for op in ops})
