"""Start a cluster's tasks, watch them until the cluster is done, carry out the failure policy, stop them.

The cluster is done when every chief and worker task still counted has exited 0 (``ps`` tasks never
finish by themselves); it ends early on a failure the policy does not tolerate, or at the deadline.
What a failure means is the policy's business (:mod:`tf_commopt.cluster.policy`); this module only
polls, restarts, drops and kills.

Example:
    >>> import io
    >>> from tf_commopt.cluster.policy import FailFast
    >>> from tf_commopt.cluster.procs import TaskSpec
    >>> sup = Supervisor(FailFast(), echo=None)
    >>> sup.start([TaskSpec("worker:0", ["sh", "-c", "exit 3"], {})])
    >>> o = sup.watch(deadline=None, timeout=None); sup.stop()
    >>> o.returncode, o.failed_task, o.message
    (3, 'worker:0', 'task worker:0 failed with exit code 3')
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, TextIO

from tf_commopt.cluster.policy import Action, ClusterView, Decision, FailurePolicy
from tf_commopt.cluster.procs import KILL_GRACE_S, Task, TaskSpec, exit_code, kill_all
from tf_commopt.core.restart import RESTART_ENV
from tf_commopt.errors import ClusterError

__all__ = ["Outcome", "Supervisor", "POLL_S"]

POLL_S = 0.05


@dataclass
class Outcome:
    """How the watch ended (see :class:`tf_commopt.cluster.ClusterResult` for the fields)."""

    returncode: int = 0
    failed_task: Optional[str] = None
    failed_signal: Optional[int] = None
    timed_out: bool = False
    message: str = ""
    tolerated: List[str] = field(default_factory=list)
    restarts: int = 0
    restart_log: List[Dict[str, object]] = field(default_factory=list)
    reporters: List[str] = field(default_factory=list)


class Supervisor:
    """The tasks of one cluster.

    Args:
        policy: decides what a task failure means.
        echo: where task lines (and the supervisor's notes) are echoed, or None.
    """

    def __init__(self, policy: FailurePolicy, echo: Optional[TextIO]):
        self.policy = policy
        self.echo = echo
        self.lock = threading.Lock()
        self.tasks: Dict[str, Task] = {}
        self.dropped: Set[str] = set()
        self.restarts = 0  # restart events (one per Decision to restart, whatever it restarts)
        self.starts: Dict[str, int] = {}  # task -> times it was started again
        self.restart_log: List[Dict[str, object]] = []
        self.t0 = time.monotonic()

    def _launch(self, spec: TaskSpec, lines: Optional[List[str]] = None) -> Task:
        try:
            return Task(spec, self.echo, self.lock, lines=lines)
        except OSError as e:
            program = spec.argv[0] if spec.argv else ""
            raise ClusterError(f"cannot start task {spec.name}: {program}: {e.strerror or e}") from None

    def start(self, specs: Sequence[TaskSpec]) -> None:
        """Start every task (ClusterError naming the task if one cannot be started)."""
        self.t0 = time.monotonic()
        for spec in specs:
            self.tasks[spec.name] = self._launch(spec)

    def restart(self, names: Sequence[str], grace_s: float = 0.0) -> None:
        """Stop the named tasks (whatever is left of them: SIGTERM, SIGKILL after ``grace_s``) and start
        them again with the same spec; each gets ``TF_COMMOPT_RESTART`` = how often it was restarted."""
        old = [self.tasks[n] for n in names]
        kill_all([t for t in old if t.poll() is None], grace_s=grace_s)
        for t in old:
            t.signal_group(signal.SIGKILL)
            t.join_output()
            n = self.starts[t.name] = self.starts.get(t.name, 0) + 1
            spec = TaskSpec(t.spec.name, t.spec.argv, dict(t.spec.env, **{RESTART_ENV: str(n)}), t.spec.cwd)
            self.tasks[t.name] = self._launch(spec, lines=t.lines)
        self.restarts += 1

    def note(self, text: str) -> None:
        """Echo one line of the launcher's own (``tf_commopt.cluster: ...``)."""
        if self.echo is not None and text:
            with self.lock:
                self.echo.write(f"tf_commopt.cluster: {text}\n")
                self.echo.flush()

    def _view(self) -> ClusterView:
        running = frozenset(n for n, t in self.tasks.items() if t.poll() is None)
        return ClusterView(running, self.restarts, frozenset(self.tasks))

    def _let_report(self, failed: str, grace_s: float, out: Outcome) -> None:
        """Give the chief (else the workers) still running ``grace_s`` to end by themselves (to say why)."""
        live = [t for t in self._finishers() if t.name != failed and t.name not in self.dropped]
        others = [t for t in live if t.name.startswith("chief:")] or live
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(t.poll() is None for t in others):
            time.sleep(POLL_S)
        out.reporters = [t.name for t in others if t.poll() not in (None, 0)]

    def _failed(self, name: str, rc: int, out: Outcome) -> bool:
        """Apply the policy to a failed task; True when the cluster ends."""
        code = exit_code(rc)
        decision: Decision = self.policy.on_failure(name, code, self._view())
        if decision.action is Action.FAIL:
            self.note(decision.note)
            if decision.grace_s > 0:
                self._let_report(name, decision.grace_s, out)
            out.failed_task, out.returncode = name, code
            out.failed_signal = -rc if rc < 0 else None
            out.message = f"task {name} failed with exit code {code}"
            return True
        out.tolerated.append(f"{name} exit {code}")
        self.restart_log.append({"task": name, "code": code, "at_s": round(time.monotonic() - self.t0, 3)})
        task = self.tasks[name]
        task.signal_group(signal.SIGKILL)  # whatever the dead task left in its group
        task.join_output()
        self.note(decision.note)
        if decision.action is Action.RESTART:
            self.restart(decision.restart, decision.grace_s)
        else:
            self.dropped.add(name)
        return False

    def _finishers(self) -> List[Task]:
        return [t for n, t in self.tasks.items() if not n.startswith("ps:")]

    def _done_message(self, out: Outcome) -> Optional[str]:
        finishers = self._finishers()
        if not all(t.poll() == 0 or t.name in self.dropped for t in finishers):
            return None
        msg = f"all {len(finishers)} task(s) finished"
        if out.tolerated:
            what = (
                "worker failure(s)" if all(f.startswith("worker:") for f in out.tolerated) else "failure(s)"
            )
            msg += f" ({len(out.tolerated)} {what} tolerated, {self.restarts} restart(s))"
        return msg

    def watch(self, deadline: Optional[float], timeout: Optional[float]) -> Outcome:
        """Poll the tasks until the cluster is done, fails, or ``deadline`` (``time.monotonic()``) passes.

        Args:
            deadline: when to give up (returncode 124), or None.
            timeout: the seconds the deadline stands for (for the message).
        """
        out = Outcome(restart_log=self.restart_log)
        while True:
            for name in list(self.tasks):
                rc = self.tasks[name].poll()
                if name in self.dropped or rc is None or rc == 0:
                    continue
                if self._failed(name, rc, out):
                    out.restarts = self.restarts
                    return out
            out.restarts = self.restarts
            done = self._done_message(out)
            if done is not None:
                out.message = done
                return out
            if deadline is not None and time.monotonic() > deadline:
                running = [t.name for t in self._finishers() if t.poll() is None]
                out.timed_out, out.returncode = True, 124
                out.message = f"timeout after {timeout:g} s; still running: {', '.join(running)}"
                return out
            time.sleep(POLL_S)

    def stop(self, grace_s: float = KILL_GRACE_S) -> None:
        """Kill every task's process group (SIGTERM, then SIGKILL after ``grace_s``) and collect the last
        lines."""
        tasks = list(self.tasks.values())
        kill_all(tasks, grace_s)
        for t in tasks:
            t.join_output()

    def outputs(self) -> Dict[str, List[str]]:
        """Task name -> its output lines so far (a restarted task's lines go on from before)."""
        return {n: list(t.lines) for n, t in self.tasks.items()}
