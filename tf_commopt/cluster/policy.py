"""When a task fails: end the cluster, start tasks again, or go on without it.

A failure policy answers one question — task T exited with code C, what now? — with a
:class:`Decision`; the :class:`~tf_commopt.cluster.supervise.Supervisor` carries it out. Three policies:

* :class:`FailFast` (collective clusters by default): the first failing task ends the cluster with its
  exit code.
* :class:`TolerateWorkers` (parameter-server clusters with a chief, by default with
  :data:`DEFAULT_WORKER_RESTARTS` restarts): a dead worker is started again (same TF_CONFIG, same
  address) while the chief runs and the restart budget lasts, else the cluster goes on without it. A
  dead ps task ends the cluster, but the chief first gets :data:`PS_REPORT_GRACE_S` seconds to notice it
  and say so in its one line; a dead chief ends it at once.
* :class:`RestartGroup` (``--max-restarts N``, collective clusters): any failure stops every task and
  starts them all again with their TF_CONFIG, at most N times; the training script resumes from its
  backup. After a task exits with :data:`~tf_commopt.core.restart.PREEMPTED_EXIT_CODE` (it saved a backup
  after SIGTERM) the others get :data:`PREEMPT_GRACE_S` seconds to finish the same backup; after a
  crash they are killed at once (their peer is gone, they cannot save).

Example:
    >>> p = failure_policy(ps=1, chief=True, tolerate_worker_failures=False, restart_workers=1)
    >>> p.on_failure("worker:1", 137, ClusterView(running=frozenset({"chief:0", "ps:0"}), restarts=0))
    Decision(action=<Action.RESTART: 'restart'>, restart=('worker:1',), note='worker:1 exited with code 137; restarting it (1/1)', grace_s=0.0)
    >>> FailFast().on_failure("worker:1", 3, ClusterView(frozenset(), 0)).action
    <Action.FAIL: 'fail'>
    >>> g = failure_policy(ps=0, chief=False, max_restarts=2)
    >>> g.on_failure("worker:1", 137, ClusterView(frozenset({"worker:0"}), 0, frozenset({"worker:0", "worker:1"}))).restart
    ('worker:0', 'worker:1')
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import FrozenSet, Optional, Tuple

from tf_commopt.core.restart import PREEMPTED_EXIT_CODE
from tf_commopt.errors import InputError

__all__ = [
    "Action",
    "Decision",
    "ClusterView",
    "FailurePolicy",
    "FailFast",
    "TolerateWorkers",
    "RestartGroup",
    "failure_policy",
    "DEFAULT_WORKER_RESTARTS",
    "PREEMPT_GRACE_S",
    "PS_REPORT_GRACE_S",
]

DEFAULT_WORKER_RESTARTS = 3  # parameter-server clusters: dead workers started again, in all
PREEMPT_GRACE_S = 60.0  # after a preempted exit: the other tasks finish the same backup
PS_REPORT_GRACE_S = 60.0  # after a ps task died: the chief notices it and says which (then exits)


class Action(enum.Enum):
    """What to do about a task that exited non-zero."""

    FAIL = "fail"  # end the cluster with the task's exit code
    RESTART = "restart"  # start ``Decision.restart`` again and go on
    DROP = "drop"  # go on without the task


@dataclass(frozen=True)
class Decision:
    """A policy's answer: the action, the tasks to start again (RESTART), a line for the log, and how
    long the tasks still running may take to end by themselves before they are killed (RESTART: those
    restarted; FAIL: the chief and workers, so they can report)."""

    action: Action
    restart: Tuple[str, ...] = ()
    note: str = ""
    grace_s: float = 0.0


@dataclass(frozen=True)
class ClusterView:
    """What a policy may look at: the tasks still running, the restarts so far, every task's name."""

    running: FrozenSet[str]
    restarts: int
    tasks: FrozenSet[str] = frozenset()


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
    without it; a ps failure ends the cluster once the chief has had time to report it; a chief failure
    ends it at once."""

    def __init__(self, max_restarts: int = DEFAULT_WORKER_RESTARTS):
        self.max_restarts = max_restarts

    def on_failure(self, task: str, code: int, view: ClusterView) -> Decision:
        if _kind(task) == "ps":
            note = f"{task} exited with code {code}; waiting for the chief to report it"
            return Decision(Action.FAIL, (), note, PS_REPORT_GRACE_S)
        if _kind(task) != "worker":
            return Decision(Action.FAIL)
        chief_up = any(_kind(t) == "chief" for t in view.running)
        if view.restarts < self.max_restarts and chief_up:
            n = view.restarts + 1
            note = f"{task} exited with code {code}; restarting it ({n}/{self.max_restarts})"
            return Decision(Action.RESTART, (task,), note)
        return Decision(Action.DROP, (), f"{task} exited with code {code}; going on without it")


class RestartGroup(FailurePolicy):
    """Any failure: stop every task and start them all again, at most ``max_restarts`` times in all."""

    def __init__(self, max_restarts: int):
        self.max_restarts = max_restarts

    def on_failure(self, task: str, code: int, view: ClusterView) -> Decision:
        how = (
            "was preempted (saved, exit code 143)"
            if code == PREEMPTED_EXIT_CODE
            else f"exited with code {code}"
        )
        if view.restarts >= self.max_restarts:
            return Decision(
                Action.FAIL, (), f"{task} {how}; no restart left ({view.restarts}/{self.max_restarts})"
            )
        n = view.restarts + 1
        grace = PREEMPT_GRACE_S if code == PREEMPTED_EXIT_CODE else 0.0
        note = f"{task} {how}; restarting every task ({n}/{self.max_restarts})"
        return Decision(Action.RESTART, tuple(sorted(view.tasks or {task})), note, grace)


def _count(value: object, flag: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"must be an integer >= 0, got {value!r}", where=flag)


def _ps_policy(
    tolerate_worker_failures: bool, restart_workers: Optional[int], max_restarts: int, fail_fast: bool
) -> FailurePolicy:
    if max_restarts:
        raise InputError(
            "restarts a collective cluster whole; a parameter-server cluster restarts dead workers "
            f"by default (--restart-workers N, default {DEFAULT_WORKER_RESTARTS})",
            where="--max-restarts",
        )
    if fail_fast:
        if tolerate_worker_failures or restart_workers is not None:
            raise InputError(
                "cannot be combined with --restart-workers or --tolerate-worker-failures", where="--fail-fast"
            )
        return FailFast()
    if restart_workers is None:
        restart_workers = 0 if tolerate_worker_failures else DEFAULT_WORKER_RESTARTS
    return TolerateWorkers(restart_workers)


def failure_policy(
    ps: int,
    chief: bool,
    tolerate_worker_failures: bool = False,
    restart_workers: Optional[int] = None,
    max_restarts: int = 0,
    fail_fast: bool = False,
) -> FailurePolicy:
    """The policy the launcher's flags ask for; InputError naming the flag when they do not fit the cluster.

    Args:
        ps: parameter-server tasks.
        chief: whether there is a chief task.
        tolerate_worker_failures: parameter-server clusters: go on without a dead worker, never restart
            it (the same as ``restart_workers=0``).
        restart_workers: parameter-server clusters: start dead workers again, at most this many times in
            all; None = :data:`DEFAULT_WORKER_RESTARTS` (0 with ``tolerate_worker_failures``).
        max_restarts: clusters without ps tasks and a chief: restart every task after a failure, at most
            this many times (0 = end at the first failure).
        fail_fast: end at the first failure whatever the cluster (parameter-server clusters' old default).
    """
    if restart_workers is not None:
        _count(restart_workers, "--restart-workers")
    _count(max_restarts, "--max-restarts")
    if ps >= 1 and chief:
        return _ps_policy(tolerate_worker_failures, restart_workers, max_restarts, fail_fast)
    if tolerate_worker_failures or restart_workers:
        flag = "--restart-workers" if restart_workers else "--tolerate-worker-failures"
        raise InputError(
            "only for parameter-server clusters (--ps >= 1 and --chief): a collective cluster cannot "
            "go on without one of its workers (--max-restarts N restarts it whole)",
            where=flag,
        )
    if fail_fast and max_restarts:
        raise InputError("cannot be combined with --max-restarts", where="--fail-fast")
    return RestartGroup(max_restarts) if max_restarts else FailFast()
