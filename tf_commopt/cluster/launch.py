"""``run_cluster``: one process per TF_CONFIG task on this machine, optionally behind a shaped network.

It puts the pieces together — the layout (:mod:`~tf_commopt.cluster.layout`), the network
(:mod:`~tf_commopt.cluster.netns`), the failure policy (:mod:`~tf_commopt.cluster.policy`) and the
supervisor (:mod:`~tf_commopt.cluster.supervise`) — and guarantees the clean-up: every task's process
group is killed and every namespace deleted whatever ends the run (normal end, failure, timeout, an
exception, Ctrl-C, SIGTERM).

Example:
    >>> r = run_cluster(["sh", "-c", "exit 3"], workers=1, echo=False)
    >>> r.returncode, r.failed_task
    (3, 'worker:0')
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, TextIO

from tf_commopt.cluster.layout import (
    HOST_ENV,
    HOSTS_ENV,
    Layout,
    pick_ports,
    plan_layout,
    replica_hosts,
    task_env,
    tf_configs,
)
from tf_commopt.cluster.netns import open_network
from tf_commopt.cluster.policy import RestartGroup, failure_policy
from tf_commopt.cluster.procs import KILL_GRACE_S, TaskSpec
from tf_commopt.cluster.shaping import DEFAULT_SHAPING, TOPOLOGIES, ShapingOptions
from tf_commopt.cluster.supervise import Outcome, Supervisor
from tf_commopt.core.restart import BACKUP_DIR_ENV, RESTART_ENV
from tf_commopt.errors import InputError

__all__ = ["ClusterResult", "run_cluster", "LAST_LINES", "TERM_GRACE_S"]

LAST_LINES = 20
TERM_GRACE_S = 30.0  # SIGTERM to the launcher: the tasks' time to save a backup and exit


@dataclass
class ClusterResult:
    """What a cluster run did.

    Attributes:
        returncode: 0 when every chief/worker task exited 0; else the first failing task's exit code
            (128 + signal number for a task killed by a signal), 124 on timeout.
        outputs: task name (``"worker:0"``) -> its output lines (stdout and stderr merged, unprefixed).
        wall_s: seconds from the first start to the end of the last task.
        failed_task: name of the first task that failed, or None.
        timed_out: True when ``timeout`` ended the run.
        tf_configs: task name -> the TF_CONFIG dict it was given.
        message: one-line summary of how the cluster ended.
        failed_signal: the signal that killed the failed task, if a signal did.
        worker_failures: the task failures the run went on through (a worker restarted or dropped on a
            parameter-server cluster, any task with ``max_restarts``), e.g. ``["worker:1 exit 137"]``.
        restarts: how many times tasks were started again: dead workers on a parameter-server cluster,
            the whole cluster with ``max_restarts``.
        restart_log: each failure the run went on through: ``{"task", "code", "at_s"}`` (seconds after
            the start when it was noticed).
        backup_dir: with ``max_restarts``: the directory made for tasks without a backup directory of
            their own (``$TF_COMMOPT_BACKUP_DIR``); removed after a successful run, kept otherwise.
        reporters: after a ps task died, the chief if it exited non-zero meanwhile (its last lines say
            why).
    """

    returncode: int
    outputs: Dict[str, List[str]]
    wall_s: float
    failed_task: Optional[str] = None
    timed_out: bool = False
    tf_configs: Dict[str, dict] = field(default_factory=dict)
    message: str = ""
    failed_signal: Optional[int] = None
    worker_failures: List[str] = field(default_factory=list)
    restarts: int = 0
    restart_log: List[Dict[str, object]] = field(default_factory=list)
    backup_dir: Optional[str] = None
    reporters: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the cluster finished with return code 0."""
        return self.returncode == 0

    def last_lines(self, task: str, n: int = LAST_LINES) -> List[str]:
        """The last ``n`` output lines of ``task``."""
        return self.outputs.get(task, [])[-n:]


def _is_int(x: object, low: int) -> bool:
    return not isinstance(x, bool) and isinstance(x, int) and x >= low


def _validate(
    command: Sequence[str],
    workers: int,
    ps: int,
    bandwidth_mbit: Optional[float],
    topology: str,
    timeout: Optional[float],
    threads_per_task: Optional[int],
    tasks_per_host: int = 1,
) -> None:
    if not _is_int(tasks_per_host, 1):
        raise InputError(f"must be an integer >= 1, got {tasks_per_host!r}", where="--tasks-per-host")
    if tasks_per_host > 1 and bandwidth_mbit is not None and topology != "switch":
        raise InputError(
            "several tasks per host need --topology switch (shared shapes every task's traffic)",
            where="--tasks-per-host",
        )
    if not command or not all(isinstance(c, str) for c in command):
        raise InputError("missing COMMAND (give it after --)", where="command")
    if not _is_int(workers, 1):
        raise InputError(f"must be an integer >= 1, got {workers!r}", where="--workers")
    if not _is_int(ps, 0):
        raise InputError(f"must be an integer >= 0, got {ps!r}", where="--ps")
    if bandwidth_mbit is not None and not (
        isinstance(bandwidth_mbit, (int, float)) and math.isfinite(bandwidth_mbit) and bandwidth_mbit > 0
    ):
        raise InputError(
            f"must be a positive number of Mbit/s, got {bandwidth_mbit!r}", where="--bandwidth-mbit"
        )
    if topology not in TOPOLOGIES:
        raise InputError(
            f"unknown topology {topology!r}; choose one of {', '.join(TOPOLOGIES)}", where="--topology"
        )
    if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
        raise InputError(f"must be a positive number of seconds, got {timeout!r}", where="--timeout")
    if threads_per_task is not None and not _is_int(threads_per_task, 0):
        raise InputError(
            f"must be an integer >= 0 or None, got {threads_per_task!r}", where="threads_per_task"
        )


class _Terminated(BaseException):
    """Raised in the main thread by the SIGTERM handler so every ``finally`` runs."""


def _raise_terminated(signum, frame):
    raise _Terminated()


@contextlib.contextmanager
def _guarded_signals() -> Iterator[Dict[str, object]]:
    """While the cluster runs, SIGTERM raises :class:`_Terminated` (main thread only); the caller's
    handlers come back afterwards. ``guard["cleanup"]()`` starts the clean-up phase, during which a second
    Ctrl-C or SIGTERM is ignored so it cannot cut the clean-up short."""
    in_main = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _raise_terminated) if in_main else None
    old_int: List[object] = []

    def cleanup() -> None:
        if in_main:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            old_int.append(signal.signal(signal.SIGINT, signal.SIG_IGN))

    try:
        yield {"cleanup": cleanup}
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, old_term if old_term is not None else signal.SIG_DFL)
            prev = old_int[0] if old_int and old_int[0] is not None else signal.default_int_handler
            signal.signal(signal.SIGINT, prev)


def _task_specs(
    layout: Layout, configs: List[dict], net, command: Sequence[str], env: Dict[str, str], cwd: Optional[str]
) -> List[TaskSpec]:
    every = replica_hosts(layout)
    return [
        TaskSpec(
            name,
            net.wrap(host, list(command)),
            dict(env, TF_CONFIG=json.dumps(cfg), **{HOST_ENV: str(host), HOSTS_ENV: every}),
            cwd,
        )
        for name, host, cfg in zip(layout.names, layout.host_of, configs)
    ]


def _backup_dir(policy: object, env: Dict[str, str], sup: Supervisor) -> Optional[str]:
    """Under a restart policy: a temporary backup directory for tasks without one of their own."""
    if not isinstance(policy, RestartGroup) or env.get(BACKUP_DIR_ENV):
        return None
    path = tempfile.mkdtemp(prefix="tf_commopt-backup-")
    env[BACKUP_DIR_ENV] = path
    sup.note(f"restarts asked for: {BACKUP_DIR_ENV}={path} for tasks given no backup directory")
    return path


def _result(outcome: Outcome, sup: Supervisor, layout: Layout, configs: List[dict], wall_s: float, backup):
    if backup and outcome.returncode == 0:
        shutil.rmtree(backup, ignore_errors=True)
    elif backup and os.path.isdir(backup):
        outcome.message += f"; backups kept in {backup}"
    return ClusterResult(
        outcome.returncode,
        sup.outputs(),
        wall_s,
        outcome.failed_task,
        outcome.timed_out,
        dict(zip(layout.names, configs)),
        outcome.message,
        outcome.failed_signal,
        outcome.tolerated,
        outcome.restarts,
        outcome.restart_log,
        backup,
        outcome.reporters,
    )


def run_cluster(
    command: List[str],
    workers: int = 2,
    ps: int = 0,
    chief: bool = False,
    bandwidth_mbit: Optional[float] = None,
    topology: str = "switch",
    timeout: Optional[float] = None,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    echo: bool = True,
    stream: Optional[TextIO] = None,
    threads_per_task: Optional[int] = None,
    tolerate_worker_failures: bool = False,
    restart_workers: Optional[int] = None,
    shaping: Optional[ShapingOptions] = None,
    max_restarts: int = 0,
    fail_fast: bool = False,
    tasks_per_host: int = 1,
) -> ClusterResult:
    """Run ``command`` once per task of a local TF_CONFIG cluster and wait for it to finish.

    Example:
        >>> r = run_cluster(["python", "-c", "import os; print(os.environ['TF_CONFIG'][:11])"],
        ...                 workers=2, echo=False)
        >>> r.returncode, r.outputs["worker:1"]
        (0, ['{"cluster":'])

    Args:
        command: argv run by every task (each gets its own ``TF_CONFIG``; ``PYTHONUNBUFFERED=1``;
            ``TF_COMMOPT_RESTART``, how often it was started again).
        workers: worker tasks (>= 1). ps: parameter-server tasks. chief: add a ``chief:0`` task.
        bandwidth_mbit: shape the cluster's network to this rate (Mbit/s); None = plain loopback.
        topology: ``"switch"`` (a shaped link per task) or ``"shared"`` (one shaped loopback); only
            used with ``bandwidth_mbit``.
        timeout: seconds before every task is killed (returncode 124).
        env: extra environment variables for every task (on top of this process's environment).
        cwd: working directory of the tasks.
        echo: print each task's lines, prefixed ``[task:i] ``, as they come (to ``stream``, default stdout).
        threads_per_task: TensorFlow/OpenMP threads of each task (:mod:`tf_commopt.threads`); None = the
            machine's cores divided among the tasks, 0 = leave TensorFlow's defaults. Variables already
            set in ``env`` or this process's environment win.
        tolerate_worker_failures: parameter-server clusters only (``ps`` >= 1 and ``chief``): go on
            without a dead worker, never restarting it (``restart_workers=0``).
        restart_workers: parameter-server clusters only: start a dead worker again (same TF_CONFIG, same
            address), at most this many times in all, while the chief runs, then go on without it;
            None = :data:`~tf_commopt.cluster.policy.DEFAULT_WORKER_RESTARTS`.
        shaping: token-bucket sizes and sysctls of the shaped network (default: the launcher's).
        max_restarts: clusters without ps tasks: after a task fails, stop every task and start them all
            again (same TF_CONFIG), at most this many times; the training script resumes from its
            backup (tasks given no backup directory get ``$TF_COMMOPT_BACKUP_DIR``, a temporary one).
        fail_fast: end at the first failing task on any cluster (parameter-server clusters too).
        tasks_per_host: consecutive tasks (chief, workers, ps in that order) that share one host: one
            address, traffic between them unshaped (the host's loopback), the host's link shaped with
            ``bandwidth_mbit`` (``topology="switch"``). Every task gets ``TF_COMMOPT_HOST`` = its host.

    Returns:
        A ClusterResult; task failures are reported in it, not raised.

    Raises:
        InputError: bad arguments. ClusterError: the processes or the shaped network cannot be set up.
        KeyboardInterrupt / SystemExit(143): on Ctrl-C / SIGTERM, after every task is killed (on SIGTERM
        the tasks first get SIGTERM and up to :data:`TERM_GRACE_S` to save and exit) and the network removed.
    """
    _validate(command, workers, ps, bandwidth_mbit, topology, timeout, threads_per_task, tasks_per_host)
    policy = failure_policy(ps, chief, tolerate_worker_failures, restart_workers, max_restarts, fail_fast)
    layout = plan_layout(workers, ps, chief, tasks_per_host)
    sup = Supervisor(policy, (stream or sys.stdout) if echo else None)
    configs: List[dict] = []
    net, backup, stop_grace = None, None, KILL_GRACE_S
    start = time.monotonic()
    with _guarded_signals() as guard:
        try:
            net = open_network(layout.hosts, bandwidth_mbit, topology, shaping or DEFAULT_SHAPING)
            configs = tf_configs(layout, net.addresses, pick_ports(len(layout.tasks)))
            base_env = task_env(len(layout.tasks), env, threads_per_task)
            base_env[RESTART_ENV] = "0"
            backup = _backup_dir(policy, base_env, sup)
            sup.start(_task_specs(layout, configs, net, command, base_env, cwd))
            outcome: Outcome = sup.watch(None if timeout is None else start + float(timeout), timeout)
        except _Terminated:
            stop_grace = TERM_GRACE_S
            raise SystemExit(128 + signal.SIGTERM) from None
        finally:
            guard["cleanup"]()
            sup.stop(stop_grace)
            if net is not None:
                net.close()
    return _result(outcome, sup, layout, configs, time.monotonic() - start, backup)
