"""Import TensorFlow models into a :class:`~tf_commopt.core.costgraph.CostGraph`.

Three sources:

* :func:`from_keras_model` — a Keras model (tf-keras or Keras 3; Sequential, functional with
  branches and skips, nested models flattened to their layers): one node per layer call, edges
  from the Keras layer graph, FLOPs from TensorFlow's per-op statistics of the layer traced alone
  at the batch size, bytes from static shapes.
* :func:`from_concrete_function` — a ``tf.function``'s concrete function (op-level nodes).
* :func:`from_graphdef_file` — a GraphDef file, ``.pb`` (binary) or ``.pbtxt`` (text), as written
  by ``tf.io.write_graph`` (op-level nodes; ``group_by_scope=True`` contracts name scopes).

Times are roofline estimates (:class:`~tf_commopt.tf.op_costs.Roofline`, backward = 2x forward
by default; presets by name in :mod:`tf_commopt.tf.devices`); :func:`tf_commopt.tf.profiler.profile_keras_model`
measures them instead. Training-step graphs (a ``tf.function`` with a GradientTape and an optimizer)
import as their forward graph with the gradient and optimizer ops' costs as each node's backward
(:mod:`tf_commopt.tf.train_graph`). SavedModels and ``.keras``/``.h5`` files:
:mod:`tf_commopt.tf.model_files`.

Example:
    >>> import tf_keras as keras                                    # doctest: +SKIP
    >>> from tf_commopt.tf.graph_import import from_keras_model     # doctest: +SKIP
    >>> g = from_keras_model(keras.applications.ResNet50(weights=None), batch_size=32)  # doctest: +SKIP
    >>> g.predecessors("conv2_block1_add")                           # doctest: +SKIP
    ['conv2_block1_0_bn', 'conv2_block1_3_bn']
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, Dict, List, Optional, Tuple, Union

import tensorflow as tf

from tf_commopt.core.costgraph import CostGraph, Node
from tf_commopt.errors import InputError
from tf_commopt.tf.keras_walk import LayerCall, dtype_size, layer_calls
from tf_commopt.tf.op_costs import (
    CostEstimateWarning,
    Roofline,
    check_unknown_flops,
    graph_flops,
    warn_unknown,
)
from tf_commopt.tf.op_graph import graph_def_to_costgraph

__all__ = [
    "from_keras_model",
    "from_concrete_function",
    "from_graph_def",
    "from_graphdef_file",
    "read_graphdef",
    "layer_flops",
    "Roofline",
    "CostEstimateWarning",
]


def _cache_key(call: LayerCall) -> Optional[str]:
    try:
        cfg = dict(call.layer.get_config())
    except Exception:  # custom layers without a config: no caching
        return None
    cfg.pop("name", None)
    others = [
        repr(x)
        for x in tf.nest.flatten((call.args, call.kwargs))
        if not any(c.__name__ == "KerasTensor" for c in type(x).__mro__)
    ]
    try:
        text = json.dumps(cfg, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        return None
    return f"{type(call.layer).__module__}.{type(call.layer).__qualname__}|{text}|{call.inputs}|{others}"


def layer_flops(
    call: LayerCall,
    unknown_flops: str = "elements",
    cache: Optional[Dict[str, Tuple[float, List[str], bool]]] = None,
) -> Tuple[float, List[str], bool]:
    """FLOPs of one layer call traced alone at its static shapes, the op types lacking statistics,
    and whether the layer moves data (False for pure reshapes such as Flatten).

    The layer is called as recorded inside a ``tf.function`` whose inputs have the call's shapes;
    FLOPs are summed over the traced graph's ops (see :mod:`tf_commopt.tf.op_costs`). Identical
    layers (same class, config and shapes) are traced once when ``cache`` is given.
    """
    key = _cache_key(call) if cache is not None else None
    if key is not None and key in cache:
        return cache[key]
    specs = [tf.TensorSpec(shape, dtype) for shape, dtype in call.inputs]
    try:
        graph = tf.function(call.call, autograph=False).get_concrete_function(*specs).graph
    except Exception as e:  # a layer that cannot be traced alone: say which
        raise InputError(
            f"cannot trace the layer alone to count its FLOPs: {type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}",
            where=f"layer {call.name!r}",
        ) from None
    result = graph_flops(graph, unknown_flops)
    if key is not None:
        cache[key] = result
    return result


def from_keras_model(
    model: Any,
    batch_size: int = 32,
    roofline: Optional[Roofline] = None,
    unknown_flops: str = "elements",
    name: Optional[str] = None,
) -> CostGraph:
    """One node per layer call of a Keras model, costs estimated with a roofline.

    Example:
        >>> g = from_keras_model(model, batch_size=64)                 # doctest: +SKIP
        >>> g["dense"].param_bytes, g["dense"].activation_bytes         # doctest: +SKIP

    Args:
        model: a built tf-keras or Keras 3 model. Nested models are flattened (``outer/inner``); a
            shared layer called k times gives nodes ``name``, ``name@1``... with its weights on the first.
        batch_size: batch size of the costs (replaces the unknown batch dimension).
        roofline: device model for times; default :class:`Roofline` (V100 fp32 peaks, backward 2x).
        unknown_flops: ``"elements"`` (1 FLOP per output element) or ``"zero"`` for ops without
            TensorFlow statistics; one :class:`CostEstimateWarning` lists them.
        name: graph name (default: the model's name).

    Returns:
        A CostGraph: node forward/backward ms from the roofline over the layer's FLOPs and bytes
        moved (inputs + outputs + all its weights; 0 for pure reshapes), ``param_bytes`` = trainable weights,
        ``activation_bytes`` = output tensors at ``batch_size``, ``label`` = layer class. The
        model's inputs are zero-cost nodes (``InputLayer``) carrying the input bytes.

    Raises:
        InputError: subclassed/unbuilt model, unknown non-batch dimension, untraceable layer.
    """
    check_unknown_flops(unknown_flops)
    roofline = roofline or Roofline()
    calls = layer_calls(model, batch_size)
    cache: Dict[str, Tuple[float, List[str], bool]] = {}
    nodes, edges, unknown = [], [], []
    for c in calls:
        if c.is_input:
            nodes.append(Node(c.name, 0.0, 0.0, 0.0, c.activation_bytes(), c.label))
            continue
        flops, unk, moves_data = layer_flops(c, unknown_flops, cache)
        unknown.extend(unk)
        weights = sum(
            float(tf.TensorShape(w.shape).num_elements()) * dtype_size(w.dtype)
            for w in getattr(c.layer, "weights", [])
        )
        moved = c.input_bytes() + c.activation_bytes() + weights if moves_data else 0.0
        fwd = roofline.forward_ms(flops, moved)
        nodes.append(
            Node(c.name, fwd, roofline.backward_ms(fwd), c.param_bytes(), c.activation_bytes(), c.label)
        )
        edges.extend((p, c.name) for p in c.preds)
    gname = name if name is not None else getattr(model, "name", "")
    warn_unknown(unknown, unknown_flops, where=f"model {gname!r}")
    return CostGraph(nodes, edges, name=gname)


def from_concrete_function(
    fn: Any,
    *,
    group_by_scope: bool = False,
    scope_depth: Optional[int] = None,
    batch_size: Optional[int] = None,
    roofline: Optional[Roofline] = None,
    unknown_flops: str = "elements",
    unknown_shapes: str = "error",
    name: Optional[str] = None,
) -> CostGraph:
    """Op-level CostGraph of a ``tf.function`` (with an input signature) or a ConcreteFunction.

    Example:
        >>> f = tf.function(lambda x: model(x), input_signature=[tf.TensorSpec([32, 784])])  # doctest: +SKIP
        >>> g = from_concrete_function(f, group_by_scope=True)        # doctest: +SKIP

    Same arguments and result as :func:`from_graph_def` on ``fn.graph.as_graph_def(add_shapes=True)``
    (the added shapes give variables their shapes, hence FLOPs to the ops reading them).
    """
    if hasattr(fn, "get_concrete_function") and not hasattr(fn, "graph"):
        try:
            fn = fn.get_concrete_function()
        except (TypeError, ValueError) as e:
            raise InputError(
                f"tf.function needs an input_signature (or pass a concrete function): {e}",
                where="from_concrete_function",
            ) from None
    if not hasattr(fn, "graph"):
        raise InputError(
            f"expected a tf.function or ConcreteFunction, got {type(fn).__name__}",
            where="from_concrete_function",
        )
    fname = getattr(fn, "name", "")
    fname = fname.decode() if isinstance(fname, bytes) else str(fname)
    return from_graph_def(
        fn.graph.as_graph_def(add_shapes=True),
        group_by_scope=group_by_scope,
        scope_depth=scope_depth,
        batch_size=batch_size,
        roofline=roofline,
        unknown_flops=unknown_flops,
        unknown_shapes=unknown_shapes,
        name=name if name is not None else fname,
        source=None,
    )


def from_graph_def(
    graph_def: Any,
    *,
    group_by_scope: bool = False,
    scope_depth: Optional[int] = None,
    batch_size: Optional[int] = None,
    roofline: Optional[Roofline] = None,
    unknown_flops: str = "elements",
    unknown_shapes: str = "error",
    name: str = "",
    source: Optional[str] = None,
    input_shapes: Optional[Dict[str, Any]] = None,
) -> CostGraph:
    """Op-level (or scope-level) CostGraph of a ``tf.compat.v1.GraphDef``.

    Args:
        graph_def: the GraphDef.
        group_by_scope: contract the ops of one name scope into one node (the scope of
            ``model/dense/MatMul`` is ``model/dense``); a scope whose contraction would close a
            cycle is split into ``scope``, ``scope#2``... so the result stays a DAG.
        scope_depth: with ``group_by_scope``, group by the first ``scope_depth`` name components.
        batch_size: replaces an unknown first dimension of every Placeholder before shape inference.
        input_shapes: ``{placeholder name: full static shape}`` for inputs with other unknown
            dimensions (``{"x": [32, 224, 224, 3]}``), applied before shape inference.
        roofline, unknown_flops: as in :func:`from_keras_model`.
        unknown_shapes: ``"error"`` (default): a computational op with a tensor whose shape is
            still unknown after shape inference (an unknown batch without ``batch_size``,
            variables whose shapes the GraphDef does not carry) raises an InputError naming it,
            since its FLOPs and bytes would silently be near zero; ``"estimate"`` accepts such
            ops (unknown tensors count 0 bytes, FLOPs as ``unknown_flops``) with one
            :class:`CostEstimateWarning`.
        name: graph name. source: file name used in error messages.

    A training step (gradient ops present) keeps only its forward ops as nodes; each node's
    ``backward_ms`` is the roofline time of the gradient and optimizer ops attributed to it
    (:mod:`tf_commopt.tf.train_graph`), not ``backward_factor x forward``.

    Plumbing ops (Const, Identity, NoOp, ReadVariableOp, resource Placeholders...) are dropped and
    edges contracted through them; floating-point constants and variable reads feeding an op are
    its ``param_bytes`` (each counted once, on its first consumer).
    """
    check_unknown_flops(unknown_flops)
    if unknown_shapes not in ("error", "estimate"):
        raise InputError(
            f"unknown_shapes must be 'error' or 'estimate', got {unknown_shapes!r}", where="unknown_shapes"
        )
    return graph_def_to_costgraph(
        graph_def,
        group_by_scope=group_by_scope,
        scope_depth=scope_depth,
        batch_size=batch_size,
        roofline=roofline or Roofline(),
        unknown_flops=unknown_flops,
        unknown_shapes=unknown_shapes,
        name=name,
        source=source,
        input_shapes=input_shapes,
    )


def _not_a_graphdef(path: str) -> Optional[InputError]:
    """An error naming what ``path`` is when it is recognisably something other than a GraphDef."""
    from tf_commopt.tf.file_kinds import sniff

    try:
        kind, what = sniff(path)
    except OSError:
        return None
    hints = {
        "savedmodel": "use from_saved_model(directory)",
        "savedmodel_pb": "use from_saved_model on its directory",
        "metagraph": "import its graph_def: from_graph_def(meta_graph_def.graph_def)",
        "checkpoint": "it has no graph; export the model (SavedModel, .keras) instead",
        "checkpoint_dir": "it has no graph; export the model (SavedModel, .keras) instead",
        "keras": "use tf_commopt.tf.model_files.from_model_file",
        "h5": "use tf_commopt.tf.model_files.from_model_file",
        "profile_json": "load it with tf_commopt.core.profiles.load_profile",
        "pipedream": "load it with tf_commopt.core.profiles.load_profile",
    }
    if kind in hints:
        return InputError(f"not a GraphDef: this is {what}; {hints[kind]}", where=path)
    return None


def read_graphdef(path: Union[str, os.PathLike]) -> Any:
    """Read a GraphDef from ``path``: text for ``.pbtxt``/``.pbtext``/``.txt``, else binary (text as fallback).

    A binary file that parses but lacks the ``versions`` field (written last by TensorFlow) gives a
    ``UserWarning``: cut exactly at a node boundary, a truncated file is still a valid GraphDef.

    Raises:
        InputError: missing file, a file that is something else (SavedModel, MetaGraphDef,
            checkpoint, Keras file, profile: the message says which), truncated/corrupt binary, or
            invalid text (``file:line``).
    """
    from google.protobuf import message, text_format

    from tf_commopt.tf.file_kinds import _plausible_graph

    path = os.fspath(path)
    if os.path.isdir(path):
        raise _not_a_graphdef(path) or InputError("no such GraphDef file (a directory)", where=path)
    if not os.path.isfile(path):
        raise InputError("no such GraphDef file", where=path)
    with open(path, "rb") as f:
        data = f.read()
    gd = tf.compat.v1.GraphDef()
    textual = path.lower().endswith((".pbtxt", ".pbtext", ".txt"))
    if not textual:
        try:
            gd.ParseFromString(data)
            if len(gd.node) and not _plausible_graph(gd):
                other = _not_a_graphdef(path)
                if other is not None:
                    raise other
            if len(gd.node) and not gd.HasField("versions"):
                warnings.warn(
                    f"{path}: GraphDef has no 'versions' field, which TensorFlow serializes last: "
                    "the file may be truncated at a node boundary",
                    UserWarning,
                    stacklevel=3,
                )
            return gd
        except message.DecodeError as e:
            binary_error = str(e) or "cannot decode"
        other = _not_a_graphdef(path)
        if other is not None:
            raise other
        try:  # a text file with a .pb name?
            data.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(
                f"not a binary GraphDef (truncated or corrupt): {binary_error}", where=path
            ) from None
        textual = True
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"not a text GraphDef: byte {e.start} is not UTF-8", where=path) from None
    try:
        text_format.Parse(text, gd)
    except text_format.ParseError as e:
        other = _not_a_graphdef(path)
        if other is not None:
            raise other from None
        line = e.GetLine() if hasattr(e, "GetLine") else None
        msg = str(e)
        if ":" in msg and msg.split(":")[0].strip().isdigit():  # strip "line:col :" prefix
            msg = msg.split(":", 2)[-1].strip()
        raise InputError(f"invalid text GraphDef: {msg}", where=f"{path}:{line}" if line else path) from None
    return gd


def from_graphdef_file(
    path: Union[str, os.PathLike],
    group_by_scope: bool = False,
    *,
    scope_depth: Optional[int] = None,
    batch_size: Optional[int] = None,
    roofline: Optional[Roofline] = None,
    unknown_flops: str = "elements",
    unknown_shapes: str = "error",
    name: Optional[str] = None,
    input_shapes: Optional[Dict[str, Any]] = None,
) -> CostGraph:
    """Op-level CostGraph of a GraphDef file written by ``tf.io.write_graph`` (``.pb`` or ``.pbtxt``).

    Example:
        >>> tf.io.write_graph(concrete_fn.graph, "/tmp", "model.pbtxt")   # doctest: +SKIP
        >>> g = from_graphdef_file("/tmp/model.pbtxt", group_by_scope=True)  # doctest: +SKIP

    Arguments as in :func:`from_graph_def`. Raises InputError naming the file on bad input.
    """
    path = os.fspath(path)
    gd = read_graphdef(path)
    return from_graph_def(
        gd,
        group_by_scope=group_by_scope,
        scope_depth=scope_depth,
        batch_size=batch_size,
        roofline=roofline,
        unknown_flops=unknown_flops,
        unknown_shapes=unknown_shapes,
        name=name if name is not None else os.path.basename(path),
        source=path,
        input_shapes=input_shapes,
    )
