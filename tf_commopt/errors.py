"""Errors raised by tf_commopt. Every user-facing error is a one-line message saying what and where.

Example:
    >>> from tf_commopt.errors import InputError
    >>> try:
    ...     raise InputError("capacities: 'x' is not a number", where="--capacities")
    ... except InputError as e:
    ...     print(e)
    --capacities: capacities: 'x' is not a number
"""

from __future__ import annotations

from typing import Optional


class TfCommoptError(Exception):
    """Base class of every error tf_commopt raises on purpose."""


class InputError(TfCommoptError, ValueError):
    """Bad user input (a file, a flag, a graph). The message names where: file:line, node, or flag."""

    def __init__(self, message: str, where: Optional[str] = None):
        self.where = where
        text = f"{where}: {message}" if where else message
        # one line, always
        super().__init__(" ".join(str(text).split()))


class GraphError(InputError):
    """A cost graph is invalid (cycle, unknown endpoint, bad number, duplicate name, empty)."""


class PlanError(InputError):
    """A partition plan does not fit its graph (missing node, non-convex stage, bad device)."""


class ClusterError(TfCommoptError, RuntimeError):
    """A local cluster could not be started, a task failed, or the environment lacks a capability."""
