"""Cost graphs from what TensorFlow users export: SavedModel directories, ``.keras`` / ``.h5`` files.

* :func:`from_saved_model` — ``tf.saved_model.save`` / ``model.export`` output: the signature's
  function is loaded and the function it calls (the model's traced graph, variables with their
  shapes) is imported op by op, like :func:`~tf_commopt.tf.graph_import.from_concrete_function`.
* :func:`from_model_file` — a ``.keras`` archive (tf-keras or Keras 3, read from its
  ``metadata.json``) or a tf-keras ``.h5`` file: loaded (``compile=False``) and imported layer by
  layer with :func:`~tf_commopt.tf.graph_import.from_keras_model`.
* :func:`load_graph` — one entry point for the CLIs' ``--profile``: profiles (JSON, PipeDream,
  bundled names) go to :func:`tf_commopt.core.profiles.load_profile`, model and graph files are
  imported; anything else is a one-line error naming what the file is (MetaGraphDef, checkpoint...).

Example:
    >>> from tf_commopt.tf.model_files import from_saved_model, load_graph      # doctest: +SKIP
    >>> g = from_saved_model("exported/", batch_size=32)                        # doctest: +SKIP
    >>> g, info = load_graph("model.keras", batch_size=32, device="h200-bf16")  # doctest: +SKIP
    >>> info["device"]                                                          # doctest: +SKIP
    'h200-bf16'
"""

from __future__ import annotations

import json
import os
import zipfile
from typing import Any, Dict, Optional, Tuple, Union

from tf_commopt.core.costgraph import CostGraph
from tf_commopt.errors import InputError
from tf_commopt.tf.file_kinds import sniff

__all__ = ["from_saved_model", "from_model_file", "load_graph", "MODEL_KINDS"]

#: file kinds :func:`load_graph` imports with TensorFlow
MODEL_KINDS = ("savedmodel", "keras", "h5", "graphdef", "graphdef_text")

_CALLS = ("StatefulPartitionedCall", "PartitionedCall")
_WRAPPER_OPS = {"Placeholder", "NoOp", "Identity", "IdentityN"} | set(_CALLS)


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__


def _body_graph(graph: Any) -> Any:
    """The graph of the function a signature wrapper calls (repeatedly, while it is only a wrapper)."""
    from tf_commopt._compat import graph_function

    for _ in range(8):
        ops = graph.get_operations()
        calls = [o for o in ops if o.type in _CALLS]
        if len(calls) != 1 or any(o.type not in _WRAPPER_OPS for o in ops):
            return graph
        fn = graph_function(graph, calls[0].get_attr("f").name)
        if fn is None or not hasattr(fn, "graph"):
            return graph
        graph = fn.graph
    return graph


def from_saved_model(
    path: Union[str, os.PathLike],
    signature: str = "serving_default",
    *,
    batch_size: Optional[int] = None,
    roofline: Any = None,
    group_by_scope: bool = False,
    scope_depth: Optional[int] = None,
    unknown_flops: str = "elements",
    unknown_shapes: str = "error",
    name: Optional[str] = None,
) -> CostGraph:
    """Op-level (or scope-level) CostGraph of a SavedModel's signature.

    Example:
        >>> tf.saved_model.save(model, "exported")                          # doctest: +SKIP
        >>> g = from_saved_model("exported", batch_size=32, group_by_scope=True)  # doctest: +SKIP

    Args:
        path: the SavedModel directory (its ``saved_model.pb`` is accepted too).
        signature: signature key (``tf.saved_model.save`` of a Keras model writes ``serving_default``).
        batch_size: replaces the unknown batch dimension of the inputs.
        roofline, group_by_scope, scope_depth, unknown_flops, unknown_shapes: as in
            :func:`tf_commopt.tf.graph_import.from_graph_def`.
        name: graph name (default: the directory's name).

    Raises:
        InputError: ``path`` is not a SavedModel (the message says what it is), it does not load,
            or ``signature`` is not one of its signatures (the message lists them).
    """
    import tensorflow as tf

    from tf_commopt.tf.graph_import import from_graph_def

    p = os.fspath(path)
    if os.path.isfile(p) and os.path.basename(p) in ("saved_model.pb", "saved_model.pbtxt"):
        p = os.path.dirname(p) or "."
    kind, what = sniff(p)
    if kind != "savedmodel":
        raise InputError(f"not a SavedModel directory: this is {what}", where=p)
    try:
        loaded = tf.saved_model.load(p, options=tf.saved_model.LoadOptions(experimental_skip_checkpoint=True))
    except Exception as e:  # corrupt or incompatible SavedModel: one line
        raise InputError(f"cannot load the SavedModel: {_first_line(e)}", where=p) from None
    sigs = dict(getattr(loaded, "signatures", {}) or {})
    if signature not in sigs:
        have = ", ".join(sorted(sigs)) or "none (save with signatures=... or model.export)"
        raise InputError(f"no signature {signature!r}; signatures: {have}", where=p)
    body = _body_graph(sigs[signature].graph)
    gd = body.as_graph_def(add_shapes=True)
    return from_graph_def(
        gd,
        group_by_scope=group_by_scope,
        scope_depth=scope_depth,
        batch_size=batch_size,
        roofline=roofline,
        unknown_flops=unknown_flops,
        unknown_shapes=unknown_shapes,
        name=name if name is not None else os.path.basename(os.path.abspath(p)),
        source=f"{p}[{signature}]",
    )


def _keras_module_for(path: str) -> Any:
    """tf_keras for .h5 and tf-keras .keras archives, Keras 3 for archives Keras 3 wrote."""
    version = ""
    if path.endswith(".keras") or zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as z:
                version = str(json.loads(z.read("metadata.json")).get("keras_version", ""))
        except (zipfile.BadZipFile, KeyError, ValueError, OSError) as e:
            raise InputError(f"not a readable .keras archive: {_first_line(e)}", where=path) from None
    if version.startswith("3"):
        import keras

        return keras
    import tf_keras

    return tf_keras


def from_model_file(
    path: Union[str, os.PathLike],
    batch_size: int = 32,
    *,
    roofline: Any = None,
    unknown_flops: str = "elements",
    name: Optional[str] = None,
) -> CostGraph:
    """Layer-level CostGraph of a saved Keras model (``.keras`` or ``.h5``), via ``from_keras_model``.

    Example:
        >>> model.save("m.keras")                                            # doctest: +SKIP
        >>> g = from_model_file("m.keras", batch_size=32)                    # doctest: +SKIP

    Raises:
        InputError: not a Keras model file (the message says what it is), or it does not load
            (e.g. an ``.h5`` holding weights only, a custom layer not registered).
    """
    from tf_commopt.tf.graph_import import from_keras_model

    p = os.fspath(path)
    kind, what = sniff(p)
    if kind not in ("keras", "h5"):
        raise InputError(f"not a Keras model file (.keras or .h5): this is {what}", where=p)
    K = _keras_module_for(p)
    try:
        model = K.models.load_model(p, compile=False)
    except Exception as e:  # weights-only h5, unknown custom objects...
        raise InputError(
            f"cannot load the Keras model with {K.__name__}: {_first_line(e)}", where=p
        ) from None
    return from_keras_model(
        model,
        batch_size=batch_size,
        roofline=roofline,
        unknown_flops=unknown_flops,
        name=name if name is not None else os.path.splitext(os.path.basename(p))[0],
    )


def load_graph(
    spec: str,
    *,
    batch_size: Optional[int] = None,
    device: Optional[str] = None,
    signature: str = "serving_default",
) -> Tuple[CostGraph, Dict[str, Any]]:
    """Load ``spec`` for the CLIs: a profile, or a model/graph file imported at ``batch_size``.

    Example:
        >>> g, info = load_graph("exported_saved_model", batch_size=32, device="h200")  # doctest: +SKIP
        >>> print(info["summary"])                                                      # doctest: +SKIP

    Args:
        spec: PipeDream graph.txt, tf_commopt JSON, a bundled profile name, a SavedModel directory,
            a ``.keras``/``.h5`` file, or a GraphDef (``.pb``/``.pbtxt``).
        batch_size: for imported models (default 32); an error for profiles (their costs are fixed).
        device: roofline preset for imported models (see :func:`tf_commopt.tf.devices.roofline_preset`,
            default ``"v100"``); an error for profiles.
        signature: SavedModel signature.

    Returns:
        ``(graph, info)``: ``info`` has ``source`` (what the file is), and for imports ``batch_size``,
        ``device``, the roofline's numbers and a one-line ``summary`` to print beside the result.
    """
    kind, what = sniff(spec) if os.path.exists(spec) else ("profile", "a bundled profile name")
    if kind in ("profile_json", "pipedream", "profile"):
        if batch_size is not None or device is not None:
            flag = "--batch-size" if batch_size is not None else "--device"
            raise InputError(
                f"{spec} is {what}: its costs are fixed; {flag} applies only to model files "
                "(SavedModel, .keras, .h5, GraphDef)",
                where=flag,
            )
        from tf_commopt.core.profiles import load_profile

        return load_profile(spec), {"source": what}
    if kind not in MODEL_KINDS:
        hint = {
            "metagraph": "; import its graph_def with from_graph_def(meta_graph.graph_def)",
            "savedmodel_pb": "; pass the SavedModel directory",
            "checkpoint": "; a checkpoint has no graph: pass the SavedModel or .keras model",
            "checkpoint_dir": "; a checkpoint has no graph: pass the SavedModel or .keras model",
        }.get(kind, "")
        if kind == "savedmodel_pb" and os.path.basename(spec) == "saved_model.pb":
            spec_dir = os.path.dirname(spec) or "."
            return load_graph(spec_dir, batch_size=batch_size, device=device, signature=signature)
        raise InputError(f"not a profile or model: this is {what}{hint}", where=spec)
    from tf_commopt.tf.devices import roofline_preset
    from tf_commopt.tf.graph_import import from_graphdef_file

    bs = 32 if batch_size is None else batch_size
    dev = device or "v100"
    roof, roof_note = roofline_preset(dev)
    if kind == "savedmodel":
        g = from_saved_model(spec, signature, batch_size=bs, roofline=roof, group_by_scope=True)
    elif kind in ("keras", "h5"):
        g = from_model_file(spec, bs, roofline=roof)
    else:
        g = from_graphdef_file(spec, group_by_scope=True, batch_size=bs, roofline=roof)
    info = {
        "source": what,
        "batch_size": bs,
        "device": dev,
        "peak_gflops": roof.peak_gflops,
        "mem_gbps": roof.mem_gbps,
        "backward_factor": roof.backward_factor,
        "device_note": roof_note,
    }
    info["summary"] = (
        f"{spec}: {what}, imported at batch {bs}: {len(g)} nodes, {g.total_ms():.3f} ms fwd+bwd, "
        f"{g.total_param_bytes() / 1e6:.2f} MB params; roofline {dev} = {roof.peak_gflops:g} GFLOP/s, "
        f"{roof.mem_gbps:g} GB/s, backward {roof.backward_factor:g}x ({roof_note})"
    )
    return g, info
