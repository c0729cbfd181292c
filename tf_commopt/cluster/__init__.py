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

from tf_commopt.cluster.cli import main
from tf_commopt.cluster.launch import LAST_LINES, ClusterResult, run_cluster
from tf_commopt.cluster.netns import SUBNET
from tf_commopt.cluster.procfs import live_processes, task_pid
from tf_commopt.cluster.shaping import (
    ETH_FRAME,
    TBF_BURST_S,
    TBF_LIMIT_S,
    TBF_MIN_BURST,
    TBF_MIN_LIMIT,
    TOPOLOGIES,
    ShapingOptions,
    tbf_command,
    tbf_params,
)

__all__ = [
    "run_cluster",
    "ClusterResult",
    "ShapingOptions",
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
]
