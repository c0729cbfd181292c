"""Measured per-layer costs of a Keras model: :func:`profile_keras_model`.

Every layer call is timed alone on a named device at a batch size, on random inputs of the real shapes,
inside ``tf.function`` (traced once, then ``warmup`` untimed runs, then the median of ``repeats`` timed
runs). Forward = the layer's call (``training=True`` where the layer takes it); backward = median over
rounds of (forward + gradients w.r.t. its float inputs and trainable weights, given a random upstream
gradient) minus the forward run of the same round, clamped at 0 (the two run alternately, so a load
change on a shared machine hits both). The median cost of calling an empty ``tf.function`` on the device
is subtracted from both (``subtract_overhead``), as a layer inside a whole model does not pay it.

Device speeds, whole-model timing and a measured roofline live in :mod:`tf_commopt.tf.capacity`, the
timing helpers in :mod:`tf_commopt.tf.timing`, emulated slow devices in :mod:`tf_commopt.tf.slowdown`;
their public names are importable from here too.

Example:
    >>> import tf_keras as keras                                               # doctest: +SKIP
    >>> from tf_commopt.tf.profiler import profile_keras_model, relative_capacities, set_slowdown
    >>> g = profile_keras_model(model, batch_size=32, device="/CPU:0", repeats=5)  # doctest: +SKIP
    >>> set_slowdown("/CPU:1", 2.0)                                             # doctest: +SKIP
    >>> relative_capacities(["/CPU:0", "/CPU:1"])                               # doctest: +SKIP
    [1.0, 0.5]
"""

from __future__ import annotations

import statistics
import warnings
from typing import Any, Callable, List, Optional, Tuple, Union

import tensorflow as tf

from tf_commopt.core.costgraph import CostGraph, Node
from tf_commopt.errors import InputError
from tf_commopt.tf.capacity import (
    device_capacity,
    measure_roofline,
    model_capacities,
    relative_capacities,
    time_keras_model,
)
from tf_commopt.tf.keras_walk import LayerCall, layer_calls
from tf_commopt.tf.op_costs import CostEstimateWarning
from tf_commopt.tf.slowdown import clear_slowdowns, get_slowdown, set_slowdown, slowdowns, slowed
from tf_commopt.tf.timing import (
    KeepState,
    check_device,
    compiled,
    random_input,
    sync,
    time_fn,
    time_interleaved,
)

__all__ = [
    "profile_keras_model",
    "time_keras_model",
    "model_capacities",
    "device_capacity",
    "relative_capacities",
    "measure_roofline",
    "time_fn",
    "time_interleaved",
    "compiled",
    "set_slowdown",
    "get_slowdown",
    "clear_slowdowns",
    "slowdowns",
    "slowed",
]


def _layer_fns(call: LayerCall) -> Tuple[Callable, Callable]:
    def forward(*xs):
        return sync(call.call_training(*xs))

    def forward_backward(*xs_and_dys):
        xs = xs_and_dys[: len(call.inputs)]
        dys = xs_and_dys[len(call.inputs) :]
        with tf.GradientTape() as tape:
            for x in xs:
                if x.dtype.is_floating:
                    tape.watch(x)
            outs = call.call_training(*xs)
        flat_out = [o for o in tf.nest.flatten(outs) if tf.is_tensor(o) and o.dtype.is_floating]
        sources = [x for x in xs if x.dtype.is_floating] + call.trainable_variables
        if not flat_out or not sources:
            return sync(outs)
        grads = tape.gradient(
            flat_out, sources, output_gradients=[tf.cast(d, o.dtype) for d, o in zip(dys, flat_out)]
        )
        return sync([outs, [g for g in grads if g is not None]])

    return forward, forward_backward


def _whole_model_times(calibrate: Union[bool, Tuple[float, float]]) -> Optional[Tuple[float, float]]:
    """The ``(forward_ms, forward_backward_ms)`` given as ``calibrate``, checked; None for True/False."""
    if calibrate is False or calibrate is True:
        return None
    try:
        whole_f, whole_fb = (float(x) for x in calibrate)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise InputError(
            f"calibrate must be True/False or (forward_ms, forward_backward_ms), got {calibrate!r}",
            where="calibrate",
        ) from None
    if not (0 < whole_f <= whole_fb):
        raise InputError(
            f"calibrate needs 0 < forward_ms <= forward_backward_ms, got {calibrate!r}", where="calibrate"
        )
    return whole_f, whole_fb


def profile_keras_model(
    model: Any,
    batch_size: int,
    device: str = "/CPU:0",
    repeats: int = 5,
    warmup: int = 1,
    seed: int = 0,
    subtract_overhead: bool = True,
    name: Optional[str] = None,
    calibrate: Union[bool, Tuple[float, float]] = False,
) -> CostGraph:
    """Measure every layer's forward and backward time (ms) on ``device`` at ``batch_size``.

    Example:
        >>> g = profile_keras_model(model, batch_size=32, device="/CPU:0", repeats=5)  # doctest: +SKIP
        >>> g["conv1"].forward_ms > 0                                               # doctest: +SKIP

    Args:
        model: a built Keras model (tf-keras or Keras 3), flattened as in
            :func:`tf_commopt.tf.graph_import.from_keras_model` (same node names and edges).
        batch_size: batch size of the random inputs.
        device: a local logical device (``/CPU:0``, ``/GPU:1``); its slow-down factor applies.
        repeats: timed runs per layer (median reported). warmup: untimed runs after tracing.
        seed: seed of the random inputs.
        subtract_overhead: subtract the median time of an empty tf.function call on the device.
        name: graph name (default: the model's).
        calibrate: scale the per-layer times so they add up to the whole model's: ``True`` measures
            the whole model (:func:`~tf_commopt.tf.capacity.time_keras_model`), or pass
            ``(forward_ms, forward_backward_ms)``. Timed alone, layers pay costs (call overhead, no
            fusion, no overlap between layers) that they partly hide inside the whole model.

    Returns:
        A CostGraph with measured ``forward_ms``/``backward_ms``; bytes as in ``from_keras_model``.
        The model's non-trainable state (BatchNorm statistics, updated by the training-mode calls)
        is restored afterwards.
    """
    if not isinstance(repeats, int) or repeats < 1:
        raise InputError(f"repeats must be a positive integer, got {repeats!r}", where="repeats")
    check_device(device)
    calls = layer_calls(model, batch_size)
    rng = tf.random.Generator.from_seed(seed)
    whole = _whole_model_times(calibrate)
    with KeepState(model):  # training-mode calls update BatchNorm statistics: restore them
        g = _profile(model, calls, rng, device, repeats, warmup, subtract_overhead, name)
    if calibrate is True:
        whole = time_keras_model(model, batch_size, device, repeats, warmup, seed)
    if whole is None:
        return g
    return _scaled(g, whole[0], max(whole[1] - whole[0], 0.0))


def _shares(times: List[float], fallback: List[float]) -> List[float]:
    """Each node's share of a total: its measured time, or (when every measured time is 0, e.g. all below
    the empty-call overhead on a loaded machine) its ``fallback`` weight (activation bytes)."""
    weights = times if sum(times) > 0 else fallback
    total = sum(weights)
    return [w / total if total > 0 else 1.0 / len(weights) for w in weights]


def _scaled(g: CostGraph, forward_ms: float, backward_ms: float) -> CostGraph:
    """``g`` with forward (backward) times scaled to add up to ``forward_ms`` (``backward_ms``)."""
    nodes = list(g.nodes.values())
    size = [float(n.activation_bytes) for n in nodes]
    fwd_ms, bwd_ms = [n.forward_ms for n in nodes], [n.backward_ms for n in nodes]
    fwd, bwd = _shares(fwd_ms, size), _shares(bwd_ms, size)
    if nodes and (sum(fwd_ms) <= 0 or sum(bwd_ms) <= 0):
        warnings.warn(
            f"model {g.name!r}: every per-layer time measured 0 ms; the whole model's time is split "
            "by activation bytes instead",
            CostEstimateWarning,
            stacklevel=3,
        )
    out = [
        Node(n.name, forward_ms * f, backward_ms * b, n.param_bytes, n.activation_bytes, n.label)
        for n, f, b in zip(nodes, fwd, bwd)
    ]
    return CostGraph(out, g.edges, name=g.name)


def _time_layer(c: LayerCall, rng: tf.random.Generator, factor: float, repeats: int, warmup: int):
    """Forward and forward+backward wall times (ms) of one layer call, interleaved."""
    xs = [random_input(s, d, rng) for s, d in c.inputs]
    dys = [random_input(s, d, rng) for s, d in c.outputs if tf.as_dtype(d).is_floating]
    fwd, fwdbwd = (compiled(f, factor) for f in _layer_fns(c))
    try:
        return time_interleaved([(fwd, xs), (fwdbwd, xs + dys)], repeats, warmup + 1)
    except InputError:
        raise
    except Exception as e:
        raise InputError(
            f"cannot run the layer alone: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}",
            where=f"layer {c.name!r}",
        ) from None


def _profile(
    model: Any,
    calls: List[LayerCall],
    rng: tf.random.Generator,
    device: str,
    repeats: int,
    warmup: int,
    subtract_overhead: bool,
    name: Optional[str],
) -> CostGraph:
    factor = get_slowdown(device)
    nodes, edges = [], []
    with tf.device(device):
        probe = compiled(sync, factor)
        tiny = tf.zeros([1])
        overhead = (
            statistics.median(time_fn(probe, [tiny], repeats, warmup + 1)) if subtract_overhead else 0.0
        )
        for c in calls:
            if c.is_input:
                nodes.append(Node(c.name, 0.0, 0.0, 0.0, c.activation_bytes(), c.label))
                continue
            tf_, tfb = _time_layer(c, rng, factor, repeats, warmup)
            f_ms = max(statistics.median(tf_) - overhead, 0.0)
            b_ms = max(statistics.median([b - a for a, b in zip(tf_, tfb)]), 0.0)
            nodes.append(Node(c.name, f_ms, b_ms, c.param_bytes(), c.activation_bytes(), c.label))
            edges.extend((p, c.name) for p in c.preds)
    gname = name if name is not None else f"{getattr(model, 'name', '')}@{device}"
    return CostGraph(nodes, edges, name=gname)
