"""Edits of a GraphDef before it is imported: a batch size, full input shapes, shaped variable reads.

A GraphDef leaves the batch dimension of its Placeholders unknown and stores no variable shapes
(resource handles are shapeless), so shape inference alone cannot cost every op. These functions fill
in what the caller knows; they edit the GraphDef they are given (pass a copy).

Example:
    >>> gd = with_batch(graph_def, 32)                                # doctest: +SKIP
    >>> gd = with_input_shapes(gd, {"img": [2, 224, 224, 3]})         # doctest: +SKIP
    >>> reads = shape_variable_reads(gd)                              # doctest: +SKIP
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List

from tf_commopt.errors import InputError

__all__ = ["with_batch", "with_input_shapes", "shape_variable_reads"]

_RESOURCE, _VARIANT = 20, 21  # DataType enum values of resource and variant tensors


def with_batch(graph_def: Any, batch_size: int) -> Any:
    """A copy of ``graph_def`` whose Placeholders with an unknown first dimension have ``batch_size`` there."""
    gd = copy.deepcopy(graph_def)
    for nd in gd.node:
        if nd.op == "Placeholder" and "shape" in nd.attr and not nd.attr["shape"].shape.unknown_rank:
            dims = nd.attr["shape"].shape.dim
            if len(dims) and dims[0].size == -1:
                dims[0].size = batch_size
    return gd


def _dims(name: str, shape: Any) -> List[int]:
    bad = f"shape of {name!r} must be a list of positive integers, got {shape!r}"
    try:
        dims = [int(d) for d in shape]
    except (TypeError, ValueError):
        raise InputError(bad, where="input_shapes") from None
    if any(d <= 0 for d in dims):
        raise InputError(bad, where="input_shapes")
    return dims


def with_input_shapes(graph_def: Any, input_shapes: Dict[str, Any]) -> Any:
    """Set the static shape of named Placeholders (before shape inference); returns ``graph_def``.

    Args:
        graph_def: the GraphDef to edit.
        input_shapes: Placeholder name -> full shape, e.g. ``{"img": [2, 224, 224, 3]}``.

    Raises:
        InputError: an unknown Placeholder (the data inputs are listed), a bad shape, or a rank mismatch.
    """
    by_name = {nd.name: nd for nd in graph_def.node if nd.op == "Placeholder"}
    for name, shape in input_shapes.items():
        nd = by_name.get(name)
        if nd is None:
            data = sorted(n for n, d in by_name.items() if d.attr["dtype"].type not in (_RESOURCE, _VARIANT))
            raise InputError(
                f"no Placeholder {name!r} in the graph; its inputs: {', '.join(data[:8]) or 'none'}",
                where="input_shapes",
            )
        dims = _dims(name, shape)
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


def shape_variable_reads(graph_def: Any) -> Dict[str, str]:
    """Turn ReadVariableOps whose ``_output_shapes`` attr is known into Placeholders of that shape.

    Ops reading variables get unknown shapes on import unless the GraphDef carries ``_output_shapes``
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
