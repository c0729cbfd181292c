"""What a model or graph file is, told from its bytes: SavedModel, MetaGraphDef, GraphDef, checkpoint...

Used to give errors that name what a file actually is ("… is a SavedModel directory: use
from_saved_model") and by :mod:`tf_commopt.tf.model_files` to dispatch a ``--profile`` path.
This module imports TensorFlow's protobuf classes only when a binary proto must be told apart.

Example:
    >>> from tf_commopt.tf.file_kinds import sniff                     # doctest: +SKIP
    >>> sniff("my_saved_model")                                        # doctest: +SKIP
    ('savedmodel', 'a SavedModel directory')
    >>> sniff("my_saved_model/saved_model.pb")[0]                      # doctest: +SKIP
    'savedmodel_pb'
"""

from __future__ import annotations

import os
import re
from typing import Any, Optional, Tuple

__all__ = ["sniff", "KINDS", "describe"]

#: kind -> how it is named in messages
KINDS = {
    "savedmodel": "a SavedModel directory",
    "savedmodel_pb": "a SavedModel's saved_model.pb (load its directory with from_saved_model)",
    "metagraph": "a MetaGraphDef (.meta, tf.compat.v1.train.export_meta_graph)",
    "graphdef": "a GraphDef",
    "graphdef_text": "a text GraphDef",
    "checkpoint": "a TensorFlow checkpoint (variables only, no graph)",
    "checkpoint_dir": "a checkpoint directory (variables only, no graph)",
    "keras": "a Keras .keras archive",
    "h5": "an HDF5 file (Keras .h5)",
    "profile_json": "a tf_commopt JSON profile",
    "pipedream": "a PipeDream graph.txt profile",
    "directory": "a directory that is not a SavedModel (no saved_model.pb)",
    "missing": "no such file or directory",
    "unknown": "not a recognised model, graph or profile file",
}

_OP = re.compile(r"^_?[A-Z][A-Za-z0-9_]*$")


def _plausible_graph(gd: Any) -> bool:
    """Every node has a name and a CamelCase op type: what TensorFlow writes, not a mis-parse."""
    return len(gd.node) > 0 and all(n.name and _OP.match(n.op or "") for n in gd.node)


def _proto_kind(data: bytes) -> Optional[str]:
    """``savedmodel_pb``, ``metagraph`` or ``graphdef`` for a binary proto that is plausibly one, else None."""
    from google.protobuf import message
    from tensorflow.core.framework import graph_pb2
    from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

    def parse(cls: Any) -> Any:
        m = cls()
        try:
            m.ParseFromString(data)
        except (message.DecodeError, RuntimeError, ValueError):
            return None
        return m

    sm = parse(saved_model_pb2.SavedModel)
    if sm is not None and len(sm.meta_graphs) > 0 and _plausible_graph(sm.meta_graphs[0].graph_def):
        return "savedmodel_pb"
    mg = parse(meta_graph_pb2.MetaGraphDef)
    if (
        mg is not None
        and mg.HasField("graph_def")
        and _plausible_graph(mg.graph_def)
        and (mg.HasField("meta_info_def") or len(mg.collection_def) or len(mg.signature_def))
    ):
        return "metagraph"
    gd = parse(graph_pb2.GraphDef)
    if gd is not None and _plausible_graph(gd):
        return "graphdef"
    return None


def sniff(path: "str | os.PathLike") -> Tuple[str, str]:
    """``(kind, description)`` of ``path``; ``kind`` is a key of :data:`KINDS`.

    Directories: SavedModel (``saved_model.pb``/``.pbtxt`` inside), checkpoint directory (a
    ``checkpoint`` file or ``*.index``). Files: by name (``.index``/``.data-*`` checkpoint shards,
    ``checkpoint`` state file), by magic bytes (HDF5, zip), by content (JSON, PipeDream text, text
    protos by their first field name) and, for binary protos, by which message parses plausibly
    (SavedModel, MetaGraphDef, GraphDef).
    """
    p = os.fspath(path)
    if os.path.isdir(p):
        names = set(os.listdir(p))
        if names & {"saved_model.pb", "saved_model.pbtxt"}:
            return "savedmodel", KINDS["savedmodel"]
        if "checkpoint" in names or any(n.endswith(".index") for n in names):
            return "checkpoint_dir", KINDS["checkpoint_dir"]
        return "directory", KINDS["directory"]
    if not os.path.isfile(p):
        return "missing", KINDS["missing"]
    base = os.path.basename(p)
    if base.endswith(".index") or re.search(r"\.data-\d+-of-\d+$", base):
        return "checkpoint", KINDS["checkpoint"]
    with open(p, "rb") as f:
        head = f.read(1 << 16)
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        return "h5", KINDS["h5"]
    if head.startswith(b"PK\x03\x04"):
        return (
            ("keras", KINDS["keras"])
            if base.endswith(".keras") or b"config.json" in head
            else ("unknown", "a zip archive that is not a .keras model")
        )
    try:
        text = head.decode("utf-8").lstrip()
    except UnicodeDecodeError:
        text = None
    if text is not None:
        if base == "checkpoint" and text.startswith("model_checkpoint_path"):
            return "checkpoint", "a checkpoint state file (names the checkpoint; no graph)"
        if text.startswith("{"):
            return "profile_json", KINDS["profile_json"]
        first = text.split("\n", 1)[0]
        if " -- " in first and "=" in first:
            return "pipedream", KINDS["pipedream"]
        if text.startswith("node") or text.startswith("versions") or text.startswith("library"):
            return "graphdef_text", KINDS["graphdef_text"]
        if text.startswith("saved_model_schema_version") or text.startswith("meta_graphs"):
            return "savedmodel_pb", "a text SavedModel proto (saved_model.pbtxt)"
        if text.startswith("meta_info_def") or text.startswith("graph_def"):
            return "metagraph", "a text MetaGraphDef"
    with open(p, "rb") as f:
        data = f.read()
    kind = _proto_kind(data)
    if kind is not None:
        return kind, KINDS[kind]
    return "unknown", KINDS["unknown"]


def describe(path: "str | os.PathLike") -> str:
    """The description half of :func:`sniff` (never raises: unreadable files are 'unknown')."""
    try:
        return sniff(path)[1]
    except OSError as e:
        return f"unreadable ({e.strerror})"
