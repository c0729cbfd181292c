"""How the ``partition`` and ``sim`` command lines read ``--profile``: one function, one place to extend.

Example:
    >>> from tf_commopt.partition.profile_arg import load_profile_arg
    >>> load_profile_arg("pipedream/alexnet").name
    'alexnet'
"""

from __future__ import annotations

import os
import re
import tempfile
from typing import Any, Dict, Optional, Tuple

from tf_commopt.core.costgraph import CostGraph
from tf_commopt.core.profiles import load_profile
from tf_commopt.errors import TfCommoptError

__all__ = ["load_profile_arg", "load_profile_or_model"]

# PipeDream's optimizer writes a node's stage as a fourth " -- " field: "name -- desc -- costs -- stage_id=N"
_STAGE_FIELD = re.compile(r" -- stage_id=\s*-?\d+\s*$")


def load_profile_arg(spec: str, flag: str = "--profile") -> CostGraph:
    """The CostGraph a ``--profile`` value names: a PipeDream graph.txt, our JSON, or a bundled name.

    A PipeDream optimizer output (node lines ending in `` -- stage_id=N``) loads as the profile it
    partitions (the stage field is read by ``--method given``, not here). Errors are one-line
    :class:`tf_commopt.errors.InputError` / ``GraphError`` naming the file (and line). ``flag`` names
    the option in messages for callers that read profiles from other flags.
    """
    text = None
    if os.path.isfile(spec):
        try:
            with open(spec, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            text = None
    if text is None or " -- stage_id=" not in text:
        return load_profile(spec)
    lines = [_STAGE_FIELD.sub("", ln) if ln and ln[0] not in "\t " else ln for ln in text.splitlines()]
    fd, tmp = tempfile.mkstemp(suffix=".graph.txt", prefix=".profile-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        try:
            g = load_profile(tmp)
        except TfCommoptError as e:
            raise type(e)(str(e).replace(tmp, spec)) from None
    finally:
        os.unlink(tmp)
    base = os.path.basename(spec)
    for suffix in (".graph.txt", ".txt"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    g.name = base
    return g


def load_profile_or_model(
    spec: str, batch_size: Optional[int] = None, device: Optional[str] = None, flag: str = "--profile"
) -> Tuple[CostGraph, Dict[str, Any]]:
    """What the CLIs' ``--profile`` accepts: everything :func:`load_profile_arg` reads (profiles, PipeDream
    optimizer outputs) and, through :func:`tf_commopt.tf.model_files.load_graph` (TensorFlow imported only
    then), a SavedModel directory, a ``.keras``/``.h5`` file or a GraphDef costed at ``batch_size`` with the
    roofline preset ``device``. Returns ``(graph, info)``; ``info["summary"]`` (imports only) is the one
    line to print beside the result.
    """
    if os.path.isfile(spec):
        try:
            with open(spec, encoding="utf-8") as f:
                if " -- stage_id=" in f.read():
                    return load_profile_arg(spec, flag), {"source": "a PipeDream optimizer output"}
        except (OSError, UnicodeDecodeError):
            pass
    from tf_commopt.tf.model_files import load_graph  # sniffs the file; TensorFlow only for model imports

    return load_graph(spec, batch_size=batch_size, device=device)
