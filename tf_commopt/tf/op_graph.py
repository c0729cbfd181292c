"""A GraphDef as an op-level CostGraph, optionally contracted by name scope into a DAG of layers.

Rules:

* Plumbing ops (:data:`~tf_commopt.tf.op_costs.PLUMBING_OPS`: Const, Identity, NoOp,
  ReadVariableOp...) and resource/variant Placeholders are dropped; an edge ``a -> b`` is kept
  when ``b`` consumes a tensor that ``a`` produces directly or through plumbing only. Control
  inputs are ignored (they carry no data); ``NextIteration`` back edges of TF1 loops are cut.
* Floating-point tensors of rank >= 1 that come from constants or variable reads (through
  plumbing only) are parameters: their bytes go to the first consuming op (each source once).
* Scope grouping: ops are taken in topological order; an op joins the latest part of its scope
  unless that part already reaches (in the contracted graph) one of the op's producers' parts —
  joining would then close a cycle, so a new part ``scope#k`` starts. The contracted graph is a
  DAG by construction (every added part edge ``q -> P`` has no path ``P -> q``).

Example:
    >>> g = graph_def_to_costgraph(cf.graph.as_graph_def(), group_by_scope=True,   # doctest: +SKIP
    ...                            scope_depth=None, batch_size=None, roofline=Roofline(),
    ...                            unknown_flops="elements", name="f", source=None)
"""

from __future__ import annotations

import copy
import warnings
from collections import Counter
from typing import Any, Dict, List, Optional, Set, Tuple

import tensorflow as tf

from tf_commopt.core.costgraph import CostGraph, Node
from tf_commopt.errors import InputError
from tf_commopt.tf.op_costs import (
    FREE_OPS,
    PARAM_SOURCES,
    PLUMBING_OPS,
    Roofline,
    _caller_stacklevel,
    op_flops,
    tensor_bytes,
    warn_unknown,
)
from tf_commopt.tf.train_graph import attribute, classify

__all__ = ["graph_def_to_costgraph", "scope_of"]


def scope_of(op_name: str, depth: Optional[int] = None) -> str:
    """Name scope of an op: ``a/b/MatMul`` -> ``a/b`` (``depth=1`` -> ``a``); no scope -> the name."""
    parts = op_name.split("/")
    if len(parts) == 1:
        return op_name
    keep = len(parts) - 1 if depth is None else max(1, min(depth, len(parts) - 1))
    return "/".join(parts[:keep])


def _with_batch(graph_def: Any, batch_size: int) -> Any:
    gd = copy.deepcopy(graph_def)
    for nd in gd.node:
        if nd.op == "Placeholder" and "shape" in nd.attr and not nd.attr["shape"].shape.unknown_rank:
            dims = nd.attr["shape"].shape.dim
            if len(dims) and dims[0].size == -1:
                dims[0].size = batch_size
    return gd


def _with_input_shapes(graph_def: Any, input_shapes: Dict[str, Any], where: str) -> Any:
    """Set the static shape of named Placeholders (before shape inference)."""
    by_name = {nd.name: nd for nd in graph_def.node if nd.op == "Placeholder"}
    for name, shape in input_shapes.items():
        nd = by_name.get(name)
        if nd is None:
            data = sorted(
                n for n, d in by_name.items() if d.attr["dtype"].type not in (20, 21)
            )  # not resource/variant
            raise InputError(
                f"no Placeholder {name!r} in the graph; its inputs: {', '.join(data[:8]) or 'none'}",
                where="input_shapes",
            )
        try:
            dims = [int(d) for d in shape]
        except (TypeError, ValueError):
            raise InputError(
                f"shape of {name!r} must be a list of positive integers, got {shape!r}", where="input_shapes"
            ) from None
        if any(d <= 0 for d in dims):
            raise InputError(
                f"shape of {name!r} must be a list of positive integers, got {shape!r}", where="input_shapes"
            )
        old = nd.attr["shape"].shape
        if not old.unknown_rank and len(old.dim) != len(dims):
            raise InputError(
                f"{name!r} has rank {len(old.dim)}, input_shapes gives {dims}", where="input_shapes"
            )
        del old.dim[:]
        old.unknown_rank = False
        for d in dims:
            old.dim.add(size=d)
    return graph_def


def _shape_variable_reads(graph_def: Any) -> Dict[str, str]:
    """Turn ReadVariableOps whose ``_output_shapes`` attr is known into Placeholders of that shape.

    A GraphDef stores no variable shapes (resource handles are shapeless), so ops reading variables
    get unknown shapes on import unless the GraphDef carries ``_output_shapes``
    (``graph.as_graph_def(add_shapes=True)``). Returns ``{read op name: variable handle name}``.
    """
    reads: Dict[str, str] = {}
    for nd in graph_def.node:
        if nd.op != "ReadVariableOp" or "_output_shapes" not in nd.attr:
            continue
        shapes = nd.attr["_output_shapes"].list.shape
        if len(shapes) != 1 or shapes[0].unknown_rank or any(d.size < 0 for d in shapes[0].dim):
            continue
        shape, dtype = copy.deepcopy(shapes[0]), nd.attr["dtype"].type
        handle = nd.input[0].split(":")[0].lstrip("^") if nd.input else nd.name
        nd.op = "Placeholder"
        del nd.input[:]
        nd.attr.clear()
        nd.attr["dtype"].type = dtype
        nd.attr["shape"].shape.CopyFrom(shape)
        reads[nd.name] = handle
    return reads


_SHAPELESS = (tf.resource, tf.variant, tf.string)


def _opaque(t: Any) -> bool:
    """Scratch tensors whose shape TensorFlow leaves unknown by design (FusedBatchNorm reserve spaces)."""
    for _ in range(8):
        if t.op.type.startswith("FusedBatchNorm") and not t.op.type.startswith("FusedBatchNormGrad"):
            return t.value_index >= 3
        if t.op.type in ("ZerosLike", "OnesLike", "Identity") and t.op.inputs:  # their zero gradients
            t = t.op.inputs[0]
            continue
        return False
    return False


def _unknown_shapes(kept: List[Any]) -> List[Tuple[Any, Any]]:
    """(op, tensor) pairs where a costed op reads or writes a numeric tensor of unknown shape."""
    out = []
    for op in kept:
        if op.type in FREE_OPS:
            continue
        outs = [
            t for i, t in enumerate(op.outputs) if i == 0 or t.consumers()
        ]  # unused aux outputs do not count
        for t in ([] if op.type == "Placeholder" else list(op.inputs)) + outs:
            if t.dtype in _SHAPELESS or _opaque(t):
                continue
            if t.shape.rank is None or not t.shape.is_fully_defined():
                out.append((op, t))
                break
    return out


def _root_cause(t: Any) -> str:
    """Why ``t`` has no shape: walk up plumbing to a variable read or a placeholder."""
    seen = 0
    op = t.op
    while op.type in PLUMBING_OPS and op.type != "ReadVariableOp" and op.inputs and seen < 50:
        op, seen = op.inputs[0].op, seen + 1
    if op.type == "ReadVariableOp":
        return (
            f"it reads variable {op.inputs[0].op.name!r}, whose shape the GraphDef does not carry "
            "(export with graph.as_graph_def(add_shapes=True), freeze with convert_variables_to_constants_v2, "
            "or import the SavedModel/concrete function)"
        )
    if op.type == "Placeholder":
        return _placeholder_hint(op.name, t.shape)
    return f"shape inference left {t.name} as {t.shape}"


def _placeholder_hint(name: str, shape: Any) -> str:
    dims = shape.as_list() if shape.rank is not None else None
    if dims is not None and dims and dims[0] is None and all(d is not None for d in dims[1:]):
        return f"input {name!r} has shape {shape}: pass batch_size"
    return f"input {name!r} has shape {shape}: pass input_shapes={{{name!r}: [...]}}"


def _unknown_shape_message(pairs: List[Tuple[Any, Any]], batch_size: Optional[int]) -> str:
    op, t = pairs[0]
    others = f" (and {len(pairs) - 1} more op(s))" if len(pairs) > 1 else ""
    if op.type == "Placeholder":
        cause = _placeholder_hint(op.name, t.shape)
    else:
        cause = _root_cause(t) if t.op is not op else f"shape inference left output {t.name} as {t.shape}"
        if t.op is not op and t.op.type not in PLUMBING_OPS and t.op.type != "Placeholder":
            cause = f"its input {t.name} has shape {t.shape}"
    return (
        f"op {op.name!r} ({op.type}) has a tensor of unknown shape{others}, so its FLOPs and bytes "
        f"would be wrong: {cause}; or pass unknown_shapes='estimate' to accept estimates"
    )


def _is_plumbing(op: Any) -> bool:
    if op.type in PLUMBING_OPS:
        return True
    if op.type == "Placeholder":
        return op.outputs[0].dtype in (tf.resource, tf.variant)
    return False


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
    """See :func:`tf_commopt.tf.graph_import.from_graph_def`."""
    where = source or (f"graph {name!r}" if name else "GraphDef")
    if batch_size is not None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise InputError(f"batch_size must be a positive integer, got {batch_size!r}", where="batch_size")
    graph_def = _with_batch(graph_def, batch_size) if batch_size is not None else copy.deepcopy(graph_def)
    if input_shapes:
        graph_def = _with_input_shapes(graph_def, dict(input_shapes), where)
    var_reads = _shape_variable_reads(graph_def)
    g = tf.Graph()
    try:
        with g.as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
    except Exception as e:  # invalid graph: missing inputs, unknown ops, bad attrs
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"cannot import the GraphDef: {first}", where=where) from None
    ops = g.get_operations()
    kind = classify(ops)
    kept = [op for op in ops if not (op.name in var_reads or _is_plumbing(op) or kind[op.name] == "dead")]
    kept_names = {op.name for op in kept}
    if not kept:
        raise InputError("no computational ops in the graph (only constants/plumbing)", where=where)
    unknown_shaped = _unknown_shapes(kept)
    if unknown_shaped and unknown_shapes == "error":
        raise InputError(_unknown_shape_message(unknown_shaped, batch_size), where=where)
    if unknown_shaped:
        from tf_commopt.tf.op_costs import CostEstimateWarning

        kinds = Counter(op.type for op, _ in unknown_shaped)
        warnings.warn(
            f"{where}: {len(unknown_shaped)} op(s) have tensors of unknown shape; their unknown tensors "
            f"count 0 bytes (unknown_shapes='estimate'): "
            + ", ".join(f"{k} ({v})" for k, v in kinds.most_common()),
            CostEstimateWarning,
            stacklevel=_caller_stacklevel(),
        )

    memo: Dict[str, Tuple[frozenset, Optional[str]]] = {}

    def resolve(op: Any) -> Tuple[frozenset, Optional[str]]:
        """Kept ops reached upward from dropped ``op`` through plumbing, and its parameter root (if any)."""
        if op.name in memo:
            return memo[op.name]
        memo[op.name] = (frozenset(), None)  # guards against cycles through plumbing
        if op.type == "NextIteration":
            return memo[op.name]
        if op.name in var_reads:
            memo[op.name] = (frozenset(), var_reads[op.name])
            return memo[op.name]
        if op.type in PARAM_SOURCES and op.type != "ReadVariableOp" or op.type == "Placeholder":
            memo[op.name] = (frozenset(), op.name)
            return memo[op.name]
        found: Set[str] = set()
        root: Optional[str] = None
        for t in op.inputs:
            if t.op.name in kept_names:
                found.add(t.op.name)
                continue
            sub, sub_root = resolve(t.op)
            found |= sub
            root = root or sub_root
        memo[op.name] = (frozenset(found), None if found else root)
        return memo[op.name]

    training = any(k == "gradient" for k in kind.values())
    nodes: List[Node] = []
    edges: List[Tuple[str, str]] = []
    counted: Set[str] = set()
    var_owner: Dict[str, str] = {}
    unknown: List[str] = []
    pending: List[Tuple[str, float]] = []  # training graphs: (gradient/optimizer op, ms) to attribute
    for op in kept:
        is_fwd = not training or kind[op.name] == "forward"
        params, moved = 0.0, 0.0
        for t in op.inputs:
            b, _ = tensor_bytes(t)
            moved += 0.0 if op.type in FREE_OPS else b
            p = t.op
            if p.name in kept_names:
                if is_fwd and (not training or kind[p.name] == "forward"):
                    edges.append((p.name, op.name))
                continue
            ups, root = resolve(p)
            if is_fwd:
                edges.extend((u, op.name) for u in sorted(ups) if not training or kind[u] == "forward")
            if is_fwd and root is not None and root not in counted and t.dtype.is_floating and t.shape.rank:
                counted.add(root)
                var_owner[root] = op.name
                params += b
        out_bytes = sum(tensor_bytes(t)[0] for t in op.outputs)
        if op.type == "Placeholder":
            nodes.append(Node(op.name, 0.0, 0.0, 0.0, out_bytes, op.type))
            continue
        flops, known = op_flops(g, op, unknown_flops)
        if not known:
            unknown.append(op.type)
        fwd = roofline.forward_ms(flops, 0.0 if op.type in FREE_OPS else moved + out_bytes)
        if not is_fwd:
            pending.append((op.name, fwd))
            continue
        nodes.append(
            Node(op.name, fwd, 0.0 if training else roofline.backward_ms(fwd), params, out_bytes, op.type)
        )
    if training:
        nodes = _attribute_backward(
            ops,
            kind,
            nodes,
            pending,
            var_owner,
            var_reads,
            lambda op: {op.name} if op.name in kept_names else set(resolve(op)[0]),
        )
    warn_unknown(unknown, unknown_flops, where=where)
    op_graph = CostGraph(nodes, edges, name=name)
    if not group_by_scope:
        return op_graph
    return _group(op_graph, scope_depth, name, {op.name for op in ops})


def _attribute_backward(
    ops: List[Any],
    kind: Dict[str, str],
    nodes: List[Node],
    pending: List[Tuple[str, float]],
    var_owner: Dict[str, str],
    var_reads: Dict[str, str],
    up: Any,
) -> List[Node]:
    """Training graphs: each forward node's backward = the times of the gradient and optimizer ops
    attributed to it (:mod:`tf_commopt.tf.train_graph`); ops tied to nothing go to the last node."""
    forward = [n.name for n in nodes if n.label != "Placeholder"]
    owners = dict(var_owner)
    owners.update({r: var_owner[h] for r, h in var_reads.items() if h in var_owner})
    owner = attribute(ops, kind, forward, owners, up, reads=var_reads)
    bwd: Counter = Counter()
    for name, ms in pending:
        o = owner.get(name)
        bwd[o if o is not None else (forward[-1] if forward else nodes[-1].name)] += ms
    return [
        Node(n.name, n.forward_ms, bwd.get(n.name, 0.0), n.param_bytes, n.activation_bytes, n.label)
        for n in nodes
    ]


def _group_key(op_name: str, depth: Optional[int], op_names: Set[str]) -> str:
    """Scope of ``op_name``; a helper op scoped under another op (``f/Reshape/shape`` under the op
    ``f/Reshape``) belongs to that op's scope."""
    s = scope_of(op_name)
    while s != op_name and s in op_names and "/" in s:
        s = scope_of(s)
    if depth is not None and s.count("/") + 1 > depth:
        s = "/".join(s.split("/")[: max(1, depth)])
    return s


def _group(op_graph: CostGraph, depth: Optional[int], name: str, op_names: Set[str]) -> CostGraph:
    part_of: Dict[str, int] = {}
    part_names: List[str] = []
    members: List[List[str]] = []
    latest: Dict[str, int] = {}
    count: Counter = Counter()
    used: Set[str] = set()
    qsucc: List[Set[int]] = []

    def reaches(a: int, b: int) -> bool:
        stack, seen = [a], {a}
        while stack:
            x = stack.pop()
            if x == b:
                return True
            for y in qsucc[x]:
                if y not in seen:
                    seen.add(y)
                    stack.append(y)
        return False

    splits: Counter = Counter()
    for v in op_graph.topological_order():
        s = _group_key(v, depth, op_names)
        pred_parts = {part_of[u] for u in op_graph.predecessors(v)}
        P = latest.get(s)
        if P is None or any(q != P and reaches(P, q) for q in pred_parts):
            if P is not None:
                splits[s] += 1
            count[s] += 1
            label = s if count[s] == 1 else f"{s}#{count[s]}"
            k = 2
            while label in used:
                label, k = f"{s}#{count[s]}.{k}", k + 1
            used.add(label)
            P = len(part_names)
            part_names.append(label)
            members.append([])
            qsucc.append(set())
            latest[s] = P
        part_of[v] = P
        members[P].append(v)
        for q in pred_parts:
            if q != P:
                qsucc[q].add(P)
    if splits:
        warnings.warn(
            f"{name or 'graph'}: {len(splits)} name scope(s) split to keep the grouped graph "
            f"acyclic: " + ", ".join(f"{s} ({k + 1} parts)" for s, k in sorted(splits.items())),
            UserWarning,
            stacklevel=_caller_stacklevel(),
        )
    nodes = []
    for P, label in enumerate(part_names):
        ms = members[P]
        leaving = [m for m in ms if any(part_of[w] != P for w in op_graph.successors(m))]
        sinks = [m for m in ms if not op_graph.successors(m)]
        act = sum(op_graph[m].activation_bytes for m in (leaving or sinks))
        types = list(dict.fromkeys(op_graph[m].label for m in ms))
        nodes.append(
            Node(
                label,
                sum(op_graph[m].forward_ms for m in ms),
                sum(op_graph[m].backward_ms for m in ms),
                sum(op_graph[m].param_bytes for m in ms),
                act,
                "+".join(types[:4]) + ("+..." if len(types) > 4 else ""),
            )
        )
    edges = [
        (part_names[part_of[a]], part_names[part_of[b]])
        for a, b in op_graph.edges
        if part_of[a] != part_of[b]
    ]
    return CostGraph(nodes, edges, name=name)
