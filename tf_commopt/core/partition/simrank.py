"""Deprecated location (one release): the simulator ranking moved to :mod:`tf_commopt.core.planner.simrank`.

The names resolve lazily, so importing the partitioner never imports the simulator.

Example:
    >>> from tf_commopt.core.partition import simrank
    >>> simrank.default_microbatches("gpipe", 4)
    16
"""

from __future__ import annotations

from typing import Any

__all__ = ["SCORES", "SIM_SCHEDULES", "check_score", "default_microbatches", "simulated_ms", "best_simulated"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from tf_commopt.core.planner import simrank as _moved  # lazy: planner imports partition and simulate

        return getattr(_moved, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
