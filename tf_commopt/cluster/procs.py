"""One task's process: start it in its own session, collect and echo its lines, signal its whole group.

A :class:`Task` leads its own process group (a new session), so a signal reaches the children it
started too; it also gets ``PR_SET_PDEATHSIG``, so the kernel kills it if the launcher dies without
cleaning up. Its stdout and stderr are merged, kept line by line and echoed prefixed ``[name] ``.

Example:
    >>> import threading
    >>> t = Task(TaskSpec("worker:0", ["sh", "-c", "echo hi"], {"PATH": "/usr/bin:/bin"}), None, threading.Lock())
    >>> t.wait(), t.join_output(), t.lines
    (0, None, ['hi'])
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, TextIO

from tf_commopt.cluster.procfs import group_has_live_process

__all__ = ["TaskSpec", "Task", "kill_all", "exit_code", "KILL_GRACE_S"]

KILL_GRACE_S = 3.0  # between SIGTERM and SIGKILL


@dataclass(frozen=True)
class TaskSpec:
    """How to start a task (again): its name, argv, environment and working directory."""

    name: str
    argv: List[str]
    env: Dict[str, str]
    cwd: Optional[str] = None


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: killed if the launcher dies
    except Exception:
        pass


def exit_code(rc: int) -> int:
    """A shell-style exit code: ``128 + N`` for a process killed by signal N (Popen's ``-N``)."""
    return 128 - rc if rc < 0 else rc


class Task:
    """A running task.

    Args:
        spec: what to run.
        echo: where to echo its lines (prefixed ``[name] ``), or None.
        lock: serialises the echo of all tasks.
        lines: lines to go on from (a restarted task keeps its earlier output).

    Raises:
        OSError: the program cannot be started.
    """

    def __init__(
        self,
        spec: TaskSpec,
        echo: Optional[TextIO],
        lock: threading.Lock,
        lines: Optional[List[str]] = None,
    ):
        self.spec = spec
        self.name = spec.name
        self.lines: List[str] = lines if lines is not None else []
        self.proc = subprocess.Popen(
            spec.argv,
            env=spec.env,
            cwd=spec.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self.pgid = self.proc.pid  # a new session: the task leads its own process group
        self._reader = threading.Thread(target=self._read, args=(echo, lock), daemon=True)
        self._reader.start()

    def _read(self, echo: Optional[TextIO], lock: threading.Lock) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            self.lines.append(line)
            if echo is not None:
                try:
                    with lock:
                        echo.write(f"[{self.name}] {line}\n")
                        echo.flush()
                except (OSError, ValueError):  # e.g. `| head` closed the pipe: keep draining the task
                    echo = None
        self.proc.stdout.close()

    def poll(self) -> Optional[int]:
        """The task's return code (Popen's: ``-N`` when killed by signal N), or None while it runs."""
        return self.proc.poll()

    def wait(self, timeout: Optional[float] = None) -> int:
        """Wait for the task's own process to end; its return code."""
        return self.proc.wait(timeout)

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to every process of the task's group (nothing if it is gone)."""
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def group_alive(self) -> bool:
        """True while a live (non-zombie) process is in the task's process group."""
        return group_has_live_process(self.pgid)

    def join_output(self, timeout: float = 5.0) -> None:
        """Wait (at most ``timeout`` s) until every line the task wrote is collected."""
        self._reader.join(timeout)


def kill_all(tasks: Sequence[Task], grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM every task's process group, then SIGKILL whatever is left after ``grace_s`` seconds."""
    for t in tasks:
        t.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        for t in tasks:
            t.poll()
        if not any(t.group_alive() for t in tasks):
            break
        time.sleep(0.05)
    for t in tasks:
        t.signal_group(signal.SIGKILL)
    for t in tasks:
        try:
            t.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass
