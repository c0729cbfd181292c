"""When a task fails: end the cluster, start tasks again, or go on without it.

A failure policy answers one question — task T exited with code C, what now? — with a
:class:`Decision`; the :class:`~tf_commopt.cluster.supervise.Supervisor` carries it out. Two policies:

* :class:`FailFast` (the default): the first failing task ends the cluster with its exit code.
* :class:`TolerateWorkers` (parameter-server clusters with a chief): a dead worker is started again
  (same TF_CONFIG, same address) while the chief runs and the restart budget lasts, else the cluster goes
  on without it; any other failure ends the cluster.

A policy may restart several tasks at once (``Decision.restart``), e.g. every worker of a collective
cluster so that they resume together from a checkpoint.

Example:
    >>> p = failure_policy(ps=1, chief=True, tolerate_worker_failures=False, restart_workers=1)
    >>> p.on_failure("worker:1", 137, ClusterView(running=frozenset({"chief:0", "ps:0"}), restarts=0))
    Decision(action=<Action.RESTART: 'restart'>, restart=('worker:1',), note='worker:1 exited with code 137; restarting it (1/1)')
    >>> FailFast().on_failure("worker:1", 3, ClusterView(frozenset(), 0)).action
    <Action.FAIL: 'fail'>
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import FrozenSet, Tuple

from tf_commopt.errors import InputError

__all__ = [
    "Action",
    "Decision",
    "ClusterView",
    "FailurePolicy",
    "FailFast",
    "TolerateWorkers",
    "failure_policy",
]


class Action(enum.Enum):
    """What to do about a task that exited non-zero."""

    FAIL = "fail"  # end the cluster with the task's exit code
    RESTART = "restart"  # start ``Decision.restart`` again and go on
    DROP = "drop"  # go on without the task


@dataclass(frozen=True)
class Decision:
    """A policy's answer: the action, the tasks to start again (RESTART) and a line for the log."""

    action: Action
    restart: Tuple[str, ...] = ()
    note: str = ""


@dataclass(frozen=True)
class ClusterView:
    """What a policy may look at: the tasks still running and the restarts so far."""

    running: FrozenSet[str]
    restarts: int


def _kind(task: str) -> str:
    return task.split(":", 1)[0]


class FailurePolicy:
    """Decides what a task failure means (see the module docstring)."""

    def on_failure(self, task: str, code: int, view: ClusterView) -> Decision:
        """The decision for ``task`` (``"worker:1"``) that exited with ``code`` (128 + N for signal N)."""
        raise NotImplementedError


class FailFast(FailurePolicy):
    """Every failure ends the cluster."""

    def on_failure(self, task: str, code: int, view: ClusterView) -> Decision:
        return Decision(Action.FAIL)


class TolerateWorkers(FailurePolicy):
    """Restart a dead worker (at most ``max_restarts`` times in all, only while a chief runs), else go on
    without it; a chief or ps failure ends the cluster."""

    def __init__(self, max_restarts: int = 0):
        self.max_restarts = max_restarts

    def on_failure(self, task: str, code: int, view: ClusterView) -> Decision:
        if _kind(task) != "worker":
            return Decision(Action.FAIL)
        chief_up = any(_kind(t) == "chief" for t in view.running)
        if view.restarts < self.max_restarts and chief_up:
            n = view.restarts + 1
            note = f"{task} exited with code {code}; restarting it ({n}/{self.max_restarts})"
            return Decision(Action.RESTART, (task,), note)
        return Decision(Action.DROP, (), f"{task} exited with code {code}; going on without it")


def failure_policy(
    ps: int, chief: bool, tolerate_worker_failures: bool, restart_workers: int
) -> FailurePolicy:
    """The policy the launcher's flags ask for; InputError naming the flag when they do not fit the cluster.

    Args:
        ps: parameter-server tasks.
        chief: whether there is a chief task.
        tolerate_worker_failures: go on when a worker dies (parameter-server clusters only).
        restart_workers: start dead workers again, at most this many times (implies tolerating).
    """
    if isinstance(restart_workers, bool) or not isinstance(restart_workers, int) or restart_workers < 0:
        raise InputError(f"must be an integer >= 0, got {restart_workers!r}", where="--restart-workers")
    if not (tolerate_worker_failures or restart_workers > 0):
        return FailFast()
    if not (ps >= 1 and chief):
        flag = "--restart-workers" if restart_workers else "--tolerate-worker-failures"
        raise InputError(
            "only for parameter-server clusters (--ps >= 1 and --chief): a collective cluster cannot "
            "go on without one of its workers",
            where=flag,
        )
    return TolerateWorkers(restart_workers)
