"""Threads per process when several TensorFlow processes share one machine.

TensorFlow sizes its intra-op and inter-op thread pools to every core of the machine. N worker
processes on C cores then run N·C compute threads on C cores and time-slice each other's kernels
(the step costs measured with the launcher's settings are in docs/results/sc_speed.md).
:func:`thread_env` gives each of N tasks
its share, through the environment variables TensorFlow reads at start-up (``TF_NUM_INTRAOP_THREADS``,
``TF_NUM_INTEROP_THREADS``) and ``OMP_NUM_THREADS`` (oneDNN). The launcher
(:func:`tf_commopt.cluster.run_cluster`) sets them for every task unless the caller's environment
already does; ``threads_per_task=0`` turns this off.

Example:
    >>> thread_env(4, cores=2)
    {'TF_NUM_INTRAOP_THREADS': '1', 'TF_NUM_INTEROP_THREADS': '2', 'OMP_NUM_THREADS': '1'}
    >>> thread_env(2, cores=16)["TF_NUM_INTRAOP_THREADS"]
    '8'
"""

from __future__ import annotations

import os
from typing import Dict, Optional

__all__ = ["THREAD_VARS", "available_cores", "thread_env"]

THREAD_VARS = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS")


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, else ``os.cpu_count()``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def thread_env(tasks: int, cores: Optional[int] = None, per_task: Optional[int] = None) -> Dict[str, str]:
    """Environment that gives each of ``tasks`` processes ``per_task`` threads (default: its share of
    ``cores``, at least 1) for TensorFlow's intra-op pool and OpenMP, and max(2, that) inter-op threads."""
    if per_task is None:
        per_task = max(1, (cores or available_cores()) // max(1, tasks))
    n = str(int(per_task))
    # at least 2 inter-op threads: one blocking op (a parameter-server closure's remote read, a
    # py_function) must not starve the rest (ParameterServerStrategy deadlocked with 1)
    return {
        "TF_NUM_INTRAOP_THREADS": n,
        "TF_NUM_INTEROP_THREADS": str(max(2, int(per_task))),
        "OMP_NUM_THREADS": n,
    }
