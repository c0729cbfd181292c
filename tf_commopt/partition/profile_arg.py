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

from tf_commopt.core.costgraph import CostGraph
from tf_commopt.core.profiles import load_profile
from tf_commopt.errors import TfCommoptError

__all__ = ["load_profile_arg"]

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
