"""Per-op costs of a TensorFlow graph: FLOPs, bytes moved, and a roofline time estimate.

FLOPs come from TensorFlow's own per-op statistics,
``tensorflow.python.framework.ops.get_stats_for_node_def(graph, node_def, "flops")`` (registered for
MatMul, Conv2D, BiasAdd, pooling, element-wise arithmetic, reductions...; they need static
shapes). An op without statistics (Relu, FusedBatchNormV3, Concat...) is *estimated* at one FLOP
per output element (``unknown_flops="elements"``) or counted as zero (``"zero"``); the callers
issue one :class:`CostEstimateWarning` listing those op types.

The time of an op (or a layer) is a roofline (Williams, Waterman, Patterson, "Roofline: an
insightful visual performance model", CACM 2009)::

    forward_ms  = 1e3 * max(flops / (peak_gflops * 1e9), bytes_moved / (mem_gbps * 1e9)) + overhead_ms
    backward_ms = backward_factor * forward_ms            (backward_factor = 2 by default)

where ``bytes_moved`` = bytes of the op's inputs (parameters included) + bytes of its outputs.
FLOPs alone mis-weigh memory-bound layers: BatchNorm and ReLU have a few percent of a CNN's
FLOPs but a large share of its time. The backward estimate 2x forward is the usual one (the
gradient w.r.t. the input and the gradient w.r.t. the weights each cost about one forward);
parameter-free layers are closer to 1x, so measure (:mod:`tf_commopt.tf.profiler`) when it matters.

Example:
    >>> r = Roofline(peak_gflops=1000.0, mem_gbps=100.0)
    >>> r.forward_ms(flops=2e9, bytes_moved=1e6)      # compute-bound: 2 GFLOP at 1 TFLOP/s
    2.0
    >>> r.forward_ms(flops=1e6, bytes_moved=1e9)      # memory-bound: 1 GB at 100 GB/s
    10.0
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Tuple

from tf_commopt.errors import InputError

__all__ = [
    "Roofline",
    "PRESETS",
    "CostEstimateWarning",
    "PLUMBING_OPS",
    "FREE_OPS",
    "op_flops",
    "tensor_bytes",
    "warn_unknown",
    "graph_flops",
]

#: Ops that move no data worth costing: dropped from op-level graphs (edges are contracted through them).
PLUMBING_OPS = frozenset(
    {
        "Const",
        "HostConst",
        "NoOp",
        "Identity",
        "IdentityN",
        "Snapshot",
        "StopGradient",
        "PreventGradient",
        "CheckNumerics",
        "EnsureShape",
        "DebugIdentity",
        "DebugIdentityV2",
        "ReadVariableOp",
        "VarHandleOp",
        "VariableV2",
        "Variable",
        "VarIsInitializedOp",
        "Assert",
        "_Arg",
        "_Retval",
        "NextIteration",
        "PlaceholderWithDefault",
        "Print",
        "PrintV2",
        "StringFormat",
    }
)

#: Variable reads and constants: their floating-point outputs feeding a kept op count as its parameters.
PARAM_SOURCES = frozenset({"Const", "HostConst", "ReadVariableOp", "VariableV2", "Variable", "VarHandleOp"})


#: Metadata-only ops (no arithmetic, no data movement): zero FLOPs and zero bytes moved.
FREE_OPS = frozenset(
    {
        "Reshape",
        "Squeeze",
        "ExpandDims",
        "Shape",
        "ShapeN",
        "Size",
        "Rank",
        "BroadcastArgs",
        "BroadcastGradientArgs",
    }
)


class CostEstimateWarning(UserWarning):
    """Some ops had no TensorFlow FLOP statistics; their FLOPs were estimated or set to zero."""


@dataclass(frozen=True)
class Roofline:
    """A device model for estimated times (see the module docstring for the rule).

    Attributes:
        peak_gflops: peak arithmetic throughput (GFLOP/s).
        mem_gbps: memory bandwidth (GB/s, 10**9 bytes per second).
        backward_factor: backward time as a multiple of forward time.
        overhead_ms: fixed cost added per node (kernel launch); 0 by default.

    The default is an NVIDIA V100 in fp32 (15.7 TFLOP/s, 900 GB/s, the datasheet peaks), the GPU
    of PipeDream's profiles; ``PRESETS`` has others, and
    :func:`tf_commopt.tf.profiler.measure_roofline` measures the device at hand.
    """

    peak_gflops: float = 15_700.0
    mem_gbps: float = 900.0
    backward_factor: float = 2.0
    overhead_ms: float = 0.0

    def __post_init__(self):
        for what in ("peak_gflops", "mem_gbps"):
            v = getattr(self, what)
            if not (isinstance(v, (int, float)) and v > 0 and v < float("inf")):
                raise InputError(f"{what} must be a positive finite number, got {v!r}", where="Roofline")

    def forward_ms(self, flops: float, bytes_moved: float) -> float:
        """Roofline forward time (ms) of ``flops`` operations moving ``bytes_moved`` bytes."""
        t = max(flops / (self.peak_gflops * 1e9), bytes_moved / (self.mem_gbps * 1e9)) * 1e3
        return t + self.overhead_ms

    def backward_ms(self, forward_ms: float) -> float:
        return self.backward_factor * forward_ms


#: Datasheet peaks (dense fp32 without tensor cores unless named), GFLOP/s and GB/s.
PRESETS: Dict[str, Roofline] = {
    "v100": Roofline(15_700.0, 900.0),
    "a100": Roofline(19_500.0, 1_555.0),
    "a100-tf32": Roofline(156_000.0, 1_555.0),
    "h200": Roofline(67_000.0, 4_800.0),
    "h200-bf16": Roofline(989_000.0, 4_800.0),
    "cpu": Roofline(100.0, 20.0),
}


def tensor_bytes(t: Any) -> Tuple[float, bool]:
    """(bytes, known) of a graph tensor from its static shape; unknown shapes count 0 bytes."""
    import tensorflow as tf

    shape = t.shape
    if shape.rank is None or not shape.is_fully_defined():
        return 0.0, False
    try:
        size = tf.as_dtype(t.dtype).size
    except TypeError:
        size = 0
    if t.dtype in (tf.resource, tf.variant, tf.string):
        size = 0
    return float(shape.num_elements() * size), True


def op_flops(graph: Any, op: Any, unknown_flops: str = "elements") -> Tuple[float, bool]:
    """FLOPs of ``op`` from TensorFlow's statistics; ``(flops, had_statistics)``.

    Without statistics (or when they need a shape that is unknown): the number of output
    elements for ``unknown_flops="elements"``, 0 for ``"zero"``. Metadata ops (:data:`FREE_OPS`,
    e.g. Reshape) cost 0 and count as having statistics.
    """
    from tf_commopt._compat import op_statistic

    if op.type in FREE_OPS:
        return 0.0, True
    value = op_statistic(graph, op.node_def, "flops")
    if value is None:
        value = _formula_flops(op)
    if value is not None:
        return float(value), True
    if unknown_flops == "zero":
        return 0.0, False
    n = 0
    for t in op.outputs:
        if t.shape.rank is not None and t.shape.is_fully_defined() and t.dtype.is_floating:
            n += t.shape.num_elements()
    return float(n), False


def _static(t: Any) -> Optional[List[int]]:
    s = t.shape
    return [int(d) for d in s] if s.rank is not None and s.is_fully_defined() else None


def _formula_flops(op: Any) -> Optional[float]:
    """FLOPs of ops TensorFlow has no statistics for but whose count is exact from shapes.

    Depthwise-convolution gradients (2 FLOPs per multiply-add, as TensorFlow counts the forward
    ``DepthwiseConv2dNative``): both cost ``2 * elements(out_backprop) * kh * kw``, the forward's count.
    """
    if op.type in ("DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter"):
        grad = _static(op.inputs[2])
        filt = _static(op.inputs[1]) if op.type.endswith("Input") else _static(op.outputs[0])
        if grad is None or filt is None or len(filt) != 4:
            return None
        n = 1
        for d in grad:
            n *= d
        return 2.0 * n * filt[0] * filt[1]
    return None


def graph_flops(graph: Any, unknown_flops: str = "elements") -> Tuple[float, List[str], bool]:
    """Total FLOPs of the non-plumbing ops of ``graph``, the types of ops lacking statistics, and
    whether any op moves data (False when every op is plumbing or metadata-only, e.g. Flatten)."""
    total, unknown, moves = 0.0, [], False
    for op in graph.get_operations():
        if op.type in PLUMBING_OPS or op.type == "Placeholder":
            continue
        moves = moves or op.type not in FREE_OPS
        f, known = op_flops(graph, op, unknown_flops)
        total += f
        if not known:
            unknown.append(op.type)
    return total, unknown, moves


def _caller_stacklevel() -> int:
    """Stack level of the first frame outside tf_commopt.tf: warnings point at the user's call."""
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    level, frame = 1, sys._getframe(1)
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == here:
        frame, level = frame.f_back, level + 1
    return level


def warn_unknown(
    op_types: Iterable[str], unknown_flops: str, where: str = "", stacklevel: Optional[int] = None
) -> None:
    """Issue ONE :class:`CostEstimateWarning` listing op types without statistics (with counts)."""
    counts = Counter(op_types)
    if not counts:
        return
    how = "estimated as 1 FLOP per output element" if unknown_flops == "elements" else "counted as 0"
    listing = ", ".join(f"{k} ({v})" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    prefix = f"{where}: " if where else ""
    warnings.warn(
        f"{prefix}FLOPs {how} for {sum(counts.values())} op(s) without TensorFlow statistics: {listing}",
        CostEstimateWarning,
        stacklevel=stacklevel or _caller_stacklevel(),
    )


def check_unknown_flops(unknown_flops: str) -> None:
    if unknown_flops not in ("elements", "zero"):
        raise InputError(
            f"unknown_flops must be 'elements' or 'zero', got {unknown_flops!r}", where="unknown_flops"
        )
