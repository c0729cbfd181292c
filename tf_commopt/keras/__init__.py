"""Keras helpers (tf-keras): telemetry callbacks for the tf_commopt strategies.

Example:
    >>> from tf_commopt.keras import SkipCorrectTelemetry   # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["SkipCorrectTelemetry"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("tf_commopt.keras.callbacks"), name)
    raise AttributeError(f"module 'tf_commopt.keras' has no attribute {name!r}")
