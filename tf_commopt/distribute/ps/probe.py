"""Whether the tasks of a cluster listen: a TCP connect to each task's address (no TensorFlow).

TensorFlow blocks without saying on what when a task of a parameter-server cluster is down; these
checks name the task instead (``failures.py`` after a round fails, ``trainer.py`` before it connects,
``serve.py`` to notice that the chief is gone).

Example:
    >>> reachable("127.0.0.1:1", timeout=0.1)
    False
    >>> unreachable({"ps": ["127.0.0.1:1"]}, timeout=0.1)
    ['ps 0 (127.0.0.1:1)']
"""

from __future__ import annotations

import socket
import time
from typing import Dict, List, Sequence

from tf_commopt.errors import ClusterError

__all__ = ["reachable", "unreachable", "wait_for_tasks"]

JOBS = ("ps", "worker")


def reachable(address: str, timeout: float = 1.0) -> bool:
    """Whether something accepts a TCP connection at ``host:port`` within ``timeout`` seconds.

    Example:
        >>> reachable("127.0.0.1:1", timeout=0.1)
        False
    """
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def unreachable(
    cluster: Dict[str, Sequence[str]], jobs: Sequence[str] = JOBS, timeout: float = 1.0
) -> List[str]:
    """The tasks of ``cluster`` (job -> addresses) in ``jobs`` that do not listen, as ``"job i (address)"``.

    Example:
        >>> unreachable({"worker": ["127.0.0.1:1"]}, timeout=0.1)
        ['worker 0 (127.0.0.1:1)']
    """
    return [
        f"{job} {i} ({a})"
        for job in jobs
        for i, a in enumerate(cluster.get(job, []))
        if not reachable(a, timeout)
    ]


def wait_for_tasks(cluster: Dict[str, Sequence[str]], timeout_s: float, poll_s: float = 0.5) -> None:
    """Return once every ps and worker task of ``cluster`` listens; ClusterError naming the silent ones
    after ``timeout_s`` seconds.

    Example:
        >>> wait_for_tasks({"ps": []}, timeout_s=1.0)
    """
    end = time.monotonic() + timeout_s
    while True:
        down = unreachable(cluster)
        if not down:
            return
        if time.monotonic() > end:
            raise ClusterError(
                f"cluster tasks not listening after {timeout_s:g} s (connect_timeout_s): {', '.join(down)}"
            )
        time.sleep(poll_s)
