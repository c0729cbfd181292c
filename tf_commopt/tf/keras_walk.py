"""Flatten a Keras model (tf-keras or Keras 3) into its layer calls, in graph order.

One :class:`LayerCall` per call of a leaf layer: nested models (functional or Sequential) are
opened and their layers joined to the outer producers, so a model used as a layer disappears
and its layers appear as ``outer_layer/inner_layer``. Edges come from the Keras layer graph
(each node's inbound tensors and their ``_keras_history``), never from layer order, so branches
and skip connections are kept. Works by duck typing on both Keras implementations; this
module never imports ``keras`` or ``tf_keras`` itself.

Example:
    >>> import tf_keras as keras                                   # doctest: +SKIP
    >>> x = keras.Input((8,)); h = keras.layers.Dense(4)(x)        # doctest: +SKIP
    >>> m = keras.Model(x, keras.layers.Add()([h, h]))             # doctest: +SKIP
    >>> [(c.name, c.preds) for c in layer_calls(m, batch_size=2)]  # doctest: +SKIP
    [('input_1', []), ('dense', ['input_1']), ('add', ['dense'])]
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from tf_commopt._compat import keras_history, keras_inbound_nodes, keras_layer_graph, keras_nodes_by_depth
from tf_commopt.errors import InputError

__all__ = ["TensorSpec", "LayerCall", "layer_calls", "dtype_size"]

TensorSpec = Tuple[Tuple[int, ...], Any]  # (static shape at the batch size, tf.DType)


def dtype_size(dtype: Any) -> int:
    """Bytes per element of a Keras/TF dtype (string or DType); 0 for non-numeric types."""
    try:
        d = tf.as_dtype(dtype)
    except TypeError:
        return 0
    if d in (tf.string, tf.resource, tf.variant):
        return 0
    return d.size


def _is_keras_tensor(x: Any) -> bool:
    return any(c.__name__ == "KerasTensor" for c in type(x).__mro__)


def _op_of(node: Any) -> Any:
    layer = getattr(node, "operation", None)
    return layer if layer is not None else node.layer


def _node_outputs(node: Any) -> List[Any]:
    outs = getattr(node, "output_tensors", None)
    if outs is None:
        outs = node.outputs
    return tf.nest.flatten(outs)


def _node_call(node: Any) -> Tuple[tuple, dict]:
    args = getattr(node, "arguments", None)
    if args is not None:  # Keras 3
        return tuple(args.args), dict(args.kwargs)
    return tuple(node.call_args), dict(node.call_kwargs)


def _history(t: Any) -> Tuple[int, int, int]:
    h = keras_history(t)
    return id(h[0]), int(h[1]), int(h[2])


def _graph_of(model: Any) -> Optional[Any]:
    """The functional graph behind a model, or None for a plain layer."""
    return keras_layer_graph(model)


def _is_model(layer: Any) -> bool:
    return any(c.__name__ in ("Model", "Functional", "Sequential") for c in type(layer).__mro__)


def _is_input_layer(layer: Any) -> bool:
    return type(layer).__name__ == "InputLayer"


@dataclass
class LayerCall:
    """One call of a leaf layer in the flattened model.

    Attributes:
        name: node name (nested models prefix ``outer/``; a layer called k>0 more times gets ``@k``).
        layer: the Keras layer object.
        preds: names of the calls producing this call's inputs (deduplicated, in argument order).
        inputs: (shape, dtype) of each Keras tensor argument, in ``tf.nest.flatten`` order.
        outputs: (shape, dtype) of each output tensor.
        args, kwargs: the recorded call arguments; Keras tensors are the placeholders ``inputs`` fill.
        first_call: False for repeated calls of a shared layer (its weights are counted once).
    """

    name: str
    layer: Any
    preds: List[str]
    inputs: List[TensorSpec]
    outputs: List[TensorSpec]
    args: tuple = ()
    kwargs: Dict[str, Any] = field(default_factory=dict)
    first_call: bool = True

    @property
    def is_input(self) -> bool:
        return _is_input_layer(self.layer)

    @property
    def label(self) -> str:
        return type(self.layer).__name__

    @property
    def trainable_variables(self) -> List[Any]:
        """The layer's trainable variables ([] for Keras 3 operations such as ``keras.ops.relu``)."""
        return list(getattr(self.layer, "trainable_variables", []))

    def activation_bytes(self) -> float:
        return float(sum(_numel(s) * dtype_size(d) for s, d in self.outputs))

    def input_bytes(self) -> float:
        return float(sum(_numel(s) * dtype_size(d) for s, d in self.inputs))

    def param_bytes(self, trainable_only: bool = True) -> float:
        if not self.first_call:
            return 0.0
        ws = getattr(self.layer, "trainable_weights" if trainable_only else "weights", [])
        return float(sum(_numel(tuple(w.shape)) * dtype_size(w.dtype) for w in ws))

    def call(self, *flat_inputs: Any) -> Any:
        """Call the layer as recorded, with ``flat_inputs`` in place of its Keras tensors."""
        flat = tf.nest.flatten((self.args, self.kwargs))
        it = iter(flat_inputs)
        flat = [next(it) if _is_keras_tensor(x) else x for x in flat]
        args, kwargs = tf.nest.pack_sequence_as((self.args, self.kwargs), flat)
        return self.layer(*args, **kwargs)

    def call_training(self, *flat_inputs: Any) -> Any:
        """Like :meth:`call` with ``training=True`` when the layer takes it and the call did not set it."""
        if "training" not in self.kwargs and _accepts_training(self.layer):
            flat = tf.nest.flatten((self.args, self.kwargs))
            it = iter(flat_inputs)
            flat = [next(it) if _is_keras_tensor(x) else x for x in flat]
            args, kwargs = tf.nest.pack_sequence_as((self.args, self.kwargs), flat)
            return self.layer(*args, training=True, **kwargs)
        return self.call(*flat_inputs)


def _accepts_training(layer: Any) -> bool:
    try:
        return "training" in inspect.signature(layer.call).parameters
    except (TypeError, ValueError):
        return False


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _spec(t: Any, batch_size: int, where: str) -> TensorSpec:
    shape = list(t.shape)
    if shape and shape[0] is None:
        shape[0] = batch_size
    if any(d is None for d in shape):
        raise InputError(
            f"tensor shape {tuple(t.shape)} has an unknown dimension besides the batch; "
            "build the model with static input shapes",
            where=where,
        )
    return tuple(int(d) for d in shape), tf.as_dtype(t.dtype)


class _Walker:
    def __init__(self, batch_size: int):
        self.batch_size = batch_size
        self.calls: List[LayerCall] = []
        self.names: set = set()
        self.times_called: Dict[int, int] = {}

    def unique(self, name: str) -> str:
        base, k = name, 2
        while name in self.names:
            name, k = f"{base}#{k}", k + 1
        self.names.add(name)
        return name

    def walk(self, model: Any, prefix: str, feed: Optional[List[Optional[str]]]) -> List[Optional[str]]:
        """Add the calls of ``model``; ``feed`` names the producers of its inputs (None at top level)."""
        graph = _graph_of(model)
        if graph is None:
            if not getattr(model, "built", True) or type(model).__name__ == "Sequential":
                raise InputError(
                    "model is not built: call it on data or give it an Input first",
                    where=f"model {model.name!r}",
                )
            raise InputError(
                "subclassed model has no layer graph; trace it with tf.function and use "
                "from_concrete_function",
                where=f"model {model.name!r}",
            )
        produced: Dict[Tuple[int, int, int], Optional[str]] = {}
        for i, t in enumerate(graph.inputs):
            key = _history(t)
            if feed is None:
                layer = keras_history(t)[0]
                name = self.unique(prefix + layer.name)
                self.calls.append(
                    LayerCall(name, layer, [], [], [_spec(t, self.batch_size, f"input {name!r}")])
                )
                produced[key] = name
            else:
                produced[key] = feed[i] if i < len(feed) else None
        by_depth = keras_nodes_by_depth(graph)
        for depth in sorted(by_depth, reverse=True):
            for node in by_depth[depth]:
                layer = _op_of(node)
                if _is_input_layer(layer):
                    continue
                node_index = keras_inbound_nodes(layer).index(node)
                args, kwargs = _node_call(node)
                kts = [x for x in tf.nest.flatten((args, kwargs)) if _is_keras_tensor(x)]
                srcs = [produced.get(_history(t)) for t in kts]
                outs = _node_outputs(node)
                if _is_model(layer) and _graph_of(layer) is not None:
                    inner = self.walk(layer, prefix + layer.name + "/", srcs)
                    for k in range(len(outs)):
                        produced[(id(layer), node_index, k)] = inner[k] if k < len(inner) else None
                    continue
                seen = self.times_called.get(id(layer), 0)
                self.times_called[id(layer)] = seen + 1
                name = self.unique(prefix + layer.name + (f"@{seen}" if seen else ""))
                preds = list(dict.fromkeys(s for s in srcs if s is not None))
                self.calls.append(
                    LayerCall(
                        name,
                        layer,
                        preds,
                        [_spec(t, self.batch_size, f"layer {name!r}") for t in kts],
                        [_spec(t, self.batch_size, f"layer {name!r}") for t in outs],
                        args,
                        kwargs,
                        first_call=(seen == 0),
                    )
                )
                for k in range(len(outs)):
                    produced[(id(layer), node_index, k)] = name
        return [produced.get(_history(t)) for t in graph.outputs]


def layer_calls(model: Any, batch_size: int = 32) -> List[LayerCall]:
    """Flatten ``model`` into leaf-layer calls in a topological order.

    Args:
        model: a built Keras model (tf-keras or Keras 3): Sequential, functional, or nested.
        batch_size: substituted for the unknown batch dimension of every tensor.

    Returns:
        The calls; the model's inputs come first as ``InputLayer`` calls without predecessors.

    Raises:
        InputError: subclassed or unbuilt model, or a tensor with an unknown non-batch dimension.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise InputError(f"batch_size must be a positive integer, got {batch_size!r}", where="batch_size")
    w = _Walker(batch_size)
    w.walk(model, "", None)
    return w.calls
