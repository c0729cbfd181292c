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
import os
from typing import Any

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "TfCommoptError",
    "core",
    "partition",
    "distribute",
    "cluster",
    "use_tf_keras",
]

from tf_commopt.errors import TfCommoptError

_LAZY = {"core", "partition", "distribute", "cluster", "tf", "keras", "sim", "datasets"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return importlib.import_module(f"tf_commopt.{name}")
    raise AttributeError(f"module 'tf_commopt' has no attribute {name!r}")


def use_tf_keras() -> None:
    """Make ``tf.keras`` tf-keras (``TF_USE_LEGACY_KERAS=1``) unless the environment already chose: the one
    place of this rule.

    TensorFlow reads the variable once, when it is first imported, so callers run this before their
    ``import tensorflow``. Callers: the modules whose machinery needs tf-keras (the pipeline and grouped
    hybrid walk tf-keras functional graphs; Keras 3 models fail under ParameterServerStrategy and
    MultiWorkerMirroredStrategy in TF 2.21) and ``experiments/__init__.py`` (every ``python -m
    experiments.x`` runs it before the runner's own imports). Importing ``tf_commopt`` does not call it,
    and neither does ``SkipCorrectStrategy``: a user whose ``tf.keras`` is Keras 3 gets a one-line error
    saying to set the variable, rather than a silently different ``tf.keras``.

    >>> from tf_commopt import use_tf_keras
    >>> use_tf_keras()            # doctest: +SKIP
    >>> import tensorflow as tf   # doctest: +SKIP
    """
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
