"""The strategies (TensorFlow). Import loads TensorFlow.

Example:
    >>> from tf_commopt.distribute import SkipCorrectStrategy   # doctest: +SKIP
    >>> strategy = SkipCorrectStrategy(interval=4, correction="vrl")   # doctest: +SKIP
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["SkipCorrectStrategy"]

_LAZY = {"SkipCorrectStrategy": "tf_commopt.distribute.skip_correct"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tf_commopt.distribute' has no attribute {name!r}")
