"""Find processes in ``/proc``: a process group's live members, a job's leftovers, a task by TF_CONFIG.

Zombies never count as alive, and this process is never reported.

Example:
    >>> live_processes("no process has this token in its command line 1f0c")
    []
    >>> task_pid("no process carries this marker 7c1d", "worker", 1) is None
    True
"""

from __future__ import annotations

import json
import os
from typing import Iterator, List, Optional, Tuple

__all__ = ["group_has_live_process", "live_processes", "task_pid"]


def _pids() -> Iterator[int]:
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            yield int(name)


def _stat_fields(pid: int) -> List[bytes]:
    """``/proc/<pid>/stat`` after the command name: state, ppid, pgrp, ..."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()


def group_has_live_process(pgid: int) -> bool:
    """True while a live (non-zombie) process is in process group ``pgid``."""
    try:
        pids = list(_pids())
    except OSError:  # pragma: no cover - no /proc: ask the kernel (zombies count as alive then)
        try:
            os.killpg(pgid, 0)
            return True
        except ProcessLookupError:
            return False
    for pid in pids:
        try:
            fields = _stat_fields(pid)
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


def live_processes(token: str) -> List[Tuple[int, str]]:
    """``(pid, command line)`` of every live process whose command line contains ``token``.

    How tests and the stress runner check that nothing outlived a job.

    Args:
        token: a string to look for in the command lines (e.g. a uuid passed as an argument).
    """
    found: List[Tuple[int, str]] = []
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            state = _stat_fields(pid)[0]
        except OSError:
            continue
        if token in cmd and state != b"Z":
            found.append((pid, cmd))
    return found


def _tf_config_task(env: List[bytes]) -> Optional[Tuple[str, int]]:
    for e in env:
        if e.startswith(b"TF_CONFIG="):
            try:
                task = json.loads(e[len("TF_CONFIG=") :]).get("task", {})
            except (ValueError, AttributeError):
                return None
            return task.get("type"), task.get("index")
    return None


def task_pid(marker: str, task_type: str, index: int) -> Optional[int]:
    """The pid of task ``task_type:index`` (read from its ``TF_CONFIG``) among the processes whose command
    line or environment contains ``marker``: how fault tests and benches pick a task to kill.

    Args:
        marker: a string in the job's command line or environment.
        task_type: ``"worker"``, ``"chief"`` or ``"ps"``.
        index: the task's index.
    """
    needle = marker.encode()
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if needle not in cmd and not any(needle in e for e in env):
            continue
        if _tf_config_task(env) == (task_type, index):
            return pid
    return None
