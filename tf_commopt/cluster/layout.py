"""Who runs where: the tasks of a cluster, the host of each, their ports, TF_CONFIG and environment.

A :class:`Layout` lists the tasks (``chief:0``, ``worker:0..``, ``ps:0..``, in that order) and the host
each runs on (an index into the network's hosts). :func:`plan_layout` puts every task on its own host,
or ``tasks_per_host`` consecutive tasks on one host: they get one address (and different ports), and
each task is told its host in ``$TF_COMMOPT_HOST`` (:data:`HOST_ENV`) and the host of every collective
replica (``chief:0`` then the workers) in ``$TF_COMMOPT_HOSTS`` (:data:`HOSTS_ENV`, comma-separated).

Example:
    >>> lay = plan_layout(workers=2, ps=1, chief=True)
    >>> lay.names, lay.hosts
    (['chief:0', 'worker:0', 'worker:1', 'ps:0'], 4)
    >>> tf_configs(lay, ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"], [1, 2, 3, 4])[2]["task"]
    {'type': 'worker', 'index': 1}
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import socket
import tempfile
import time
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from tf_commopt.errors import ClusterError
from tf_commopt.threads import thread_env

__all__ = [
    "HOST_ENV",
    "HOSTS_ENV",
    "replica_hosts",
    "Layout",
    "plan_layout",
    "pick_ports",
    "tf_configs",
    "task_env",
]

HOST_ENV = "TF_COMMOPT_HOST"
"""The environment variable holding a task's host index (tasks with the same value share a host)."""

HOSTS_ENV = "TF_COMMOPT_HOSTS"
"""The environment variable holding the host index of every collective replica task (``chief:0`` first,
then ``worker:0..``), comma-separated: what two-level averaging groups by."""


@dataclass(frozen=True)
class Layout:
    """Tasks and the host each runs on.

    Attributes:
        tasks: ``(type, index)`` of every task, e.g. ``("worker", 1)``.
        host_of: the host index of each task (same order as ``tasks``).
    """

    tasks: Tuple[Tuple[str, int], ...]
    host_of: Tuple[int, ...]

    @property
    def names(self) -> List[str]:
        """``"type:index"`` of every task."""
        return [f"{t}:{i}" for t, i in self.tasks]

    @property
    def hosts(self) -> int:
        """How many hosts the tasks use."""
        return max(self.host_of) + 1 if self.host_of else 0


def replica_hosts(layout: "Layout") -> str:
    """The value of :data:`HOSTS_ENV`: the host of ``chief:0`` (if any) and of every worker, in order.

    >>> replica_hosts(plan_layout(4, 1, False, tasks_per_host=2))
    '0,0,1,1'
    """
    order = [i for i, (t, _) in enumerate(layout.tasks) if t == "chief"]
    order += [i for i, (t, _) in enumerate(layout.tasks) if t == "worker"]
    return ",".join(str(layout.host_of[i]) for i in order)


def plan_layout(workers: int, ps: int, chief: bool, tasks_per_host: int = 1) -> Layout:
    """The tasks of a cluster (``chief:0`` first, then workers, then ps tasks), ``tasks_per_host``
    consecutive tasks on each host (the last host may have fewer).

    Example:
        >>> plan_layout(2, 0, False).host_of
        (0, 1)
        >>> plan_layout(4, 0, False, tasks_per_host=2).host_of
        (0, 0, 1, 1)
    """
    tasks = [("chief", 0)] if chief else []
    tasks += [("worker", i) for i in range(workers)]
    tasks += [("ps", i) for i in range(ps)]
    return Layout(tuple(tasks), tuple(i // tasks_per_host for i in range(len(tasks))))


def _ephemeral_range() -> Tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections (Linux; 32768-60999 elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(v) for v in f.read().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _registry_path() -> str:
    """This user's record of recently picked ports (one per user: another user's file is not writable)."""
    return os.path.join(tempfile.gettempdir(), f"tf_commopt-ports-{os.getuid()}.json")


def _draw(n: int, pool: range, held: Mapping[int, float]) -> List[int]:
    rng = random.Random()
    ports: List[int] = []
    for _ in range(100 * n):
        if len(ports) == n:
            break
        p = rng.choice(pool)
        if p not in held and p not in ports and _port_is_free(p):
            ports.append(p)
    if len(ports) < n:
        raise ClusterError(f"no {n} free TCP ports in {pool.start}-{pool.stop - 1}")
    return ports


def pick_ports(n: int, hold_s: float = 600.0) -> List[int]:
    """``n`` distinct free TCP ports for a cluster's servers, safe against the races of a busy machine.

    A port is only bound by its task's server seconds after it is picked. Two things could take it in
    between, and either gives a cluster whose tasks talk to the wrong peer: an outgoing connection of
    any process (the kernel hands those ports from its ephemeral range, so ports are picked outside
    it), and another launcher of the same user (picked ports are recorded, under a file lock, in
    ``$TMPDIR/tf_commopt-ports-<uid>.json`` for ``hold_s`` seconds, and not handed out again
    meanwhile; without a writable registry the ports are only picked outside the ephemeral range).

    Example:
        >>> a, b = pick_ports(2)
        >>> a != b and not _ephemeral_range()[0] <= a <= _ephemeral_range()[1]
        True
    """
    lo, hi = _ephemeral_range()
    pool = range(20000, lo) if lo - 20000 >= 4096 else range(hi + 1, 65536)
    path = _registry_path()
    try:
        lock = open(path + ".lock", "a")
    except OSError:
        return _draw(n, pool, {})
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        now = time.time()
        try:
            with open(path) as f:
                held = {int(p): t for p, t in json.load(f).items() if now - t < hold_s}
        except (OSError, ValueError, AttributeError):
            held = {}
        ports = _draw(n, pool, held)
        held.update((p, now) for p in ports)
        tmp = f"{path}.{os.getpid()}"
        try:
            with open(tmp, "w") as f:
                json.dump(held, f)
            os.replace(tmp, path)
        except OSError:
            pass
    return ports


def tf_configs(layout: Layout, addresses: Sequence[str], ports: Sequence[int]) -> List[dict]:
    """The TF_CONFIG dict of every task: the same ``cluster``, its own ``task``.

    Args:
        layout: the tasks and their hosts.
        addresses: the address of every host.
        ports: one port per task.
    """
    cluster: Dict[str, List[str]] = {}
    for (ttype, _), host, port in zip(layout.tasks, layout.host_of, ports):
        cluster.setdefault(ttype, []).append(f"{addresses[host]}:{port}")
    return [{"cluster": cluster, "task": {"type": t, "index": i}} for t, i in layout.tasks]


def task_env(tasks: int, env: Optional[Mapping[str, str]], threads_per_task: Optional[int]) -> Dict[str, str]:
    """The environment every task starts from (TF_CONFIG is added per task).

    This process's environment, updated with ``env``, plus ``PYTHONUNBUFFERED=1`` and, unless
    ``threads_per_task == 0``, each task's share of the cores (:func:`tf_commopt.threads.thread_env`);
    variables already set win.

    Example:
        >>> task_env(2, {"PYTHONUNBUFFERED": "0"}, 3)["PYTHONUNBUFFERED"]
        '0'
    """
    base = dict(os.environ)
    base.update(env or {})
    base.setdefault("PYTHONUNBUFFERED", "1")
    if threads_per_task != 0:
        for var, value in thread_env(tasks, per_task=threads_per_task).items():
            base.setdefault(var, value)
    return base
