"""How the ``partition`` and ``sim`` command lines read ``--profile``: one function, one place to extend.

Example:
    >>> from tf_commopt.partition.profile_arg import load_profile_arg
    >>> load_profile_arg("pipedream/alexnet").name
    'alexnet'
"""
from __future__ import annotations

from tf_commopt.core.costgraph import CostGraph
from tf_commopt.core.profiles import load_profile

__all__ = ["load_profile_arg"]


def load_profile_arg(spec: str, flag: str = "--profile") -> CostGraph:
    """The CostGraph a ``--profile`` value names: a PipeDream graph.txt, our JSON, or a bundled name.

    Errors are one-line :class:`tf_commopt.errors.InputError` / ``GraphError`` naming the file (and line).
    ``flag`` names the option in messages for callers that read profiles from other flags.
    """
    return load_profile(spec)
