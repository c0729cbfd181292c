"""tf_commopt: communication-optimised distributed training for TensorFlow.

Importing ``tf_commopt`` (or ``tf_commopt.core``) does not import TensorFlow; the
TensorFlow-facing names below are loaded on first use.

Example:
    >>> import tf_commopt
    >>> from tf_commopt.core import CostGraph, Node
    >>> g = CostGraph([Node("a", 1.0, 2.0), Node("b", 1.0, 2.0)], [("a", "b")])
    >>> len(g)
    2
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "TfCommoptError",
    "core",
    "partition",
    "distribute",
    "cluster",
]

from tf_commopt.errors import TfCommoptError  # noqa: E402  (pure Python)

_LAZY = {"core", "partition", "distribute", "cluster", "tf", "keras", "sim", "datasets"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return importlib.import_module(f"tf_commopt.{name}")
    raise AttributeError(f"module 'tf_commopt' has no attribute {name!r}")
