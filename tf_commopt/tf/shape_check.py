"""Tensors of unknown shape in an imported graph: find them, say why in one line, or warn.

An op whose input or output shape is unknown would be costed at (nearly) zero FLOPs and bytes, silently.
:func:`check_shapes` refuses that (``unknown_shapes="error"``) with the cause — a variable read without
shape, an input without batch size or full shape — or warns once (``"estimate"``). Scratch outputs
TensorFlow leaves unshaped by design (FusedBatchNorm reserve spaces, their zero gradients) and unused
auxiliary outputs do not count.

Example:
    >>> check_shapes(kept_ops, "error", where="model.pb")   # doctest: +SKIP
"""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Any, List, Tuple

import tensorflow as tf

from tf_commopt.errors import InputError
from tf_commopt.tf.op_costs import FREE_OPS, PLUMBING_OPS, CostEstimateWarning, _caller_stacklevel

__all__ = ["unknown_shapes", "unknown_shape_message", "check_shapes"]

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


def unknown_shapes(kept: List[Any]) -> List[Tuple[Any, Any]]:
    """(op, tensor) pairs where a costed op reads or writes a numeric tensor of unknown shape."""
    out = []
    for op in kept:
        if op.type in FREE_OPS:
            continue
        outs = [t for i, t in enumerate(op.outputs) if i == 0 or t.consumers()]  # unused aux outputs: no
        for t in ([] if op.type == "Placeholder" else list(op.inputs)) + outs:
            if t.dtype in _SHAPELESS or _opaque(t):
                continue
            if t.shape.rank is None or not t.shape.is_fully_defined():
                out.append((op, t))
                break
    return out


def _placeholder_hint(name: str, shape: Any) -> str:
    dims = shape.as_list() if shape.rank is not None else None
    if dims is not None and dims and dims[0] is None and all(d is not None for d in dims[1:]):
        return f"input {name!r} has shape {shape}: pass batch_size"
    return f"input {name!r} has shape {shape}: pass input_shapes={{{name!r}: [...]}}"


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


def unknown_shape_message(pairs: List[Tuple[Any, Any]]) -> str:
    """One line naming the first op with an unknown shape and why (``pairs`` from :func:`unknown_shapes`)."""
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


def check_shapes(kept: List[Any], mode: str, where: str) -> None:
    """Refuse (``mode="error"``) or warn about (``"estimate"``) costed ops with tensors of unknown shape.

    Args:
        kept: the ops that will be costed.
        mode: ``"error"`` (InputError naming ``where``) or ``"estimate"`` (one CostEstimateWarning).
        where: the file or graph named in the message.
    """
    pairs = unknown_shapes(kept)
    if not pairs:
        return
    if mode == "error":
        raise InputError(unknown_shape_message(pairs), where=where)
    kinds = Counter(op.type for op, _ in pairs)
    warnings.warn(
        f"{where}: {len(pairs)} op(s) have tensors of unknown shape; their unknown tensors "
        f"count 0 bytes (unknown_shapes='estimate'): "
        + ", ".join(f"{k} ({v})" for k, v in kinds.most_common()),
        CostEstimateWarning,
        stacklevel=_caller_stacklevel(),
    )
