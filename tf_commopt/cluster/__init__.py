"""Local cluster launcher: one process per TF_CONFIG task, optionally behind a bandwidth-shaped network.

Starts ``workers`` (+ ``ps``, + an optional ``chief``) processes that all run the same COMMAND, each with
its own ``TF_CONFIG`` on free ports, prefixes every output line with the task name (``[worker:1] ...``),
and ends with the exit code of the first task that fails, killing every child's process group on
failure, timeout, Ctrl-C or SIGTERM. With ``bandwidth_mbit`` the tasks run in private network namespaces
whose links ``tc tbf`` shapes (root). Guide: docs/cluster.md.

Modules, one job each:

* :mod:`~tf_commopt.cluster.launch` — :func:`run_cluster` and :class:`ClusterResult`: puts the pieces
  together and guarantees the clean-up.
* :mod:`~tf_commopt.cluster.layout` — the tasks, the host each runs on, ports, TF_CONFIG, environment.
* :mod:`~tf_commopt.cluster.shaping` — the token bucket for a rate (pure); :mod:`~tf_commopt.cluster.netns`
  — loopback or shaped namespaces (veth, bridge, ``tc``).
* :mod:`~tf_commopt.cluster.policy` — what a task failure means (end, restart, go on);
  :mod:`~tf_commopt.cluster.supervise` — start, watch, restart, stop; :mod:`~tf_commopt.cluster.procs` —
  one task's process and output; :mod:`~tf_commopt.cluster.procfs` — finding processes in ``/proc``.
* :mod:`~tf_commopt.cluster.cli` — ``python -m tf_commopt.cluster``.

Example:
    >>> from tf_commopt.cluster import run_cluster
    >>> r = run_cluster(["python", "-c", "import os; print(os.environ['TF_CONFIG'][:11])"],
    ...                 workers=2, echo=False)
    >>> r.returncode, r.outputs["worker:1"]
    (0, ['{"cluster":'])

Command line::

    python -m tf_commopt.cluster --workers 2 --bandwidth-mbit 100 -- python -m experiments.train --steps 20
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

from tf_commopt.cluster import launch as _launch
from tf_commopt.cluster import shaping as _shaping
from tf_commopt.cluster.cli import main
from tf_commopt.cluster.launch import LAST_LINES, ClusterResult
from tf_commopt.cluster.netns import SUBNET
from tf_commopt.cluster.procfs import live_processes, task_pid
from tf_commopt.cluster.shaping import ETH_FRAME, TOPOLOGIES, ShapingOptions

__all__ = [
    "run_cluster",
    "ClusterResult",
    "ShapingOptions",
    "current_shaping",
    "TOPOLOGIES",
    "tbf_params",
    "tbf_command",
    "live_processes",
    "task_pid",
    "main",
    "LAST_LINES",
    "SUBNET",
    "ETH_FRAME",
    "TBF_BURST_S",
    "TBF_MIN_BURST",
    "TBF_LIMIT_S",
    "TBF_MIN_LIMIT",
    "SYSCTLS",
]

# The package's shaping settings: run_cluster, tbf_params and tbf_command below read them at call time
# when no ShapingOptions is given, so a comparison run may set them (``tf_commopt.cluster.SYSCTLS = (...)``).
TBF_BURST_S: float = _shaping.TBF_BURST_S  # token bucket depth in seconds of traffic ...
TBF_MIN_BURST: int = _shaping.TBF_MIN_BURST  # ... but at least 4 full frames
TBF_LIMIT_S: float = _shaping.TBF_LIMIT_S  # queue: seconds of traffic ...
TBF_MIN_LIMIT: int = _shaping.TBF_MIN_LIMIT  # ... but at least 128 KiB
SYSCTLS: Tuple[str, ...] = ()  # "key=value" sysctls set in every namespace


def current_shaping() -> ShapingOptions:
    """The :class:`ShapingOptions` the package settings above give now.

    Example:
        >>> current_shaping() == ShapingOptions()
        True
    """
    return ShapingOptions(TBF_BURST_S, TBF_MIN_BURST, TBF_LIMIT_S, TBF_MIN_LIMIT, tuple(SYSCTLS))


@functools.wraps(_launch.run_cluster)
def run_cluster(*args, shaping: Optional[ShapingOptions] = None, **kwargs) -> ClusterResult:
    return _launch.run_cluster(*args, shaping=shaping or current_shaping(), **kwargs)


@functools.wraps(_shaping.tbf_params)
def tbf_params(bandwidth_mbit: float, options: Optional[ShapingOptions] = None) -> Tuple[int, int, int]:
    return _shaping.tbf_params(bandwidth_mbit, options or current_shaping())


@functools.wraps(_shaping.tbf_command)
def tbf_command(dev: str, bandwidth_mbit: float, options: Optional[ShapingOptions] = None):
    return _shaping.tbf_command(dev, bandwidth_mbit, options or current_shaping())
