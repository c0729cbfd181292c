"""Local cluster launcher: one process per TF_CONFIG task, optionally behind a bandwidth-shaped network.

Starts ``workers`` (+ ``ps``, + an optional ``chief``) processes that all run the same COMMAND, each with
its own ``TF_CONFIG`` on free ports, prefixes every output line with the task name (``[worker:1] ...``),
and ends with the exit code of the first task that fails (its last lines are shown), killing every
child's process group on failure, timeout, Ctrl-C or SIGTERM. The cluster is done when every chief and
worker task has exited 0 (``ps`` tasks never finish by themselves and are then stopped).

With ``bandwidth_mbit`` the tasks run in private network namespaces (root, ``ip`` and ``tc`` needed):

* ``topology="switch"`` (default): one namespace per task holding ``eth0`` (``10.213.0.<i+1>/24``, MTU
  1500), joined by a veth pair to a bridge in a switch namespace; both ends of every veth are shaped
  with ``tc tbf``, so each task's link runs at ``bandwidth_mbit`` in each direction (hosts with their
  own NIC on a switch). TF_CONFIG names the tasks by those addresses.
* ``topology="shared"``: all tasks in one namespace whose loopback is shaped
  (``ip link set lo mtu 1500 up``): the *sum* of all traffic shares one segment of ``bandwidth_mbit``.

Every shaped device gets (``tbf_command``; R in bytes/s)::

    tc qdisc add dev DEV root tbf rate <R x 8>bit burst max(R x 1 ms, 4 x 1514) limit max(R x 100 ms, 128 KiB)

e.g. ``rate 20000000bit burst 6056 limit 250000`` at 20 Mbit/s, ``burst 125000 limit 12500000`` at 1 Gbit/s.
Why: a token bucket passes ``burst`` bytes at full speed after an idle gap, so a deep bucket (the old
256 KiB) let a small model's whole sync through unthrottled (0.2 MB at 20 Mbit/s in 5 ms instead of
>= 80 ms). 1 ms of traffic is what a real NIC's line-rate pacing allows; the bucket must still hold a
few full frames, because tbf drops a packet larger than its bucket for ever: with a bucket below one
1514-byte frame (or the loopback's 64 KiB MTU and a small bucket) TCP stalls and TF's collectives abort
("tasks are unhealthy (stopped sending heartbeats)") — that, not gRPC, is why MTU 1500 is needed. The
queue limit only has to be bounded and larger than a few frames (20 kB still ran TF collectives at the
cap); 100 ms of traffic keeps drops rare without a bufferbloated queue. ``net.ipv4.tcp_slow_start_after_idle``
stays at the Linux default 1: setting it to 0 (as many datacenter hosts do) was measured and did not help
here — with microsecond RTTs the 10-segment restart window already fills the pipe — and it sent more
retransmissions into the queue (0 vs 1: 0.734 vs 0.719 s for 4 MB at 50 Mbit/s, 2.042 vs 2.043 s for
40 MB over 4 ranks at 1 Gbit/s, 0.379 vs 0.373 s and 297 vs 140 retransmitted segments for 0.4 MB at
10 Mbit/s). ``SYSCTLS`` lists sysctls to set in every namespace (none by default). See docs/cluster.md.

Namespaces (and with them their links and qdiscs) are deleted when the cluster ends, whatever the
reason. Only private addresses inside namespaces made here are used; no traffic leaves the machine.

Example:
    >>> from tf_commopt.cluster import run_cluster
    >>> r = run_cluster(["python", "-c", "import os; print(os.environ['TF_CONFIG'][:11])"],
    ...                 workers=2, echo=False)
    >>> r.returncode, r.outputs["worker:1"]
    (0, ['{"cluster":'])

Command line::

    python -m tf_commopt.cluster --workers 2 --bandwidth-mbit 100 -- python -m experiments.train --steps 20
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, TextIO, Tuple

from tf_commopt._cli import CliParser, add_tf_log_level, quiet_tensorflow
from tf_commopt.errors import ClusterError, InputError
from tf_commopt.threads import thread_env

__all__ = ["run_cluster", "ClusterResult", "TOPOLOGIES", "tbf_params", "tbf_command", "main"]

TOPOLOGIES = ("switch", "shared")
SUBNET = "10.213.0"  # private addresses, only inside namespaces this module creates
ETH_FRAME = 1514  # bytes of a full Ethernet frame at MTU 1500 (what tbf counts per packet)
TBF_BURST_S = 0.001  # token bucket depth: 1 ms of traffic at the rate ...
TBF_MIN_BURST = 4 * ETH_FRAME  # ... but at least 4 full frames (a bucket smaller than a frame drops it)
TBF_LIMIT_S = 0.1  # queue: 100 ms of traffic at the rate ...
TBF_MIN_LIMIT = 128 * 1024  # ... but at least 128 KiB
SYSCTLS: Tuple[
    str, ...
] = ()  # "key=value" sysctls set in every namespace (e.g. net.ipv4.tcp_slow_start_after_idle=0)
LAST_LINES = 20
_NS_PREFIX = "tfco"
_KILL_GRACE_S = 3.0


@dataclass
class ClusterResult:
    """What a cluster run did.

    Attributes:
        returncode: 0 when every chief/worker task exited 0; else the first failing task's exit code
            (128 + signal number for a task killed by a signal), 124 on timeout, 130 on interrupt.
        outputs: task name (``"worker:0"``) -> its output lines (stdout and stderr merged, unprefixed).
        wall_s: seconds from the first start to the end of the last task.
        failed_task: name of the first task that failed, or None.
        timed_out: True when ``timeout`` ended the run.
        tf_configs: task name -> the TF_CONFIG dict it was given.
        message: one-line summary of how the cluster ended.
        failed_signal: the signal that killed the failed task, if a signal did.
        worker_failures: with ``tolerate_worker_failures`` / ``restart_workers``: the worker deaths the
            run went on through, e.g. ``["worker:1 exit 137"]``.
        restarts: how many dead workers were started again (``restart_workers``).
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

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def last_lines(self, task: str, n: int = LAST_LINES) -> List[str]:
        """The last ``n`` output lines of ``task``."""
        return self.outputs.get(task, [])[-n:]


# ----------------------------------------------------------------------------------------------- tasks
def _task_names(workers: int, ps: int, chief: bool) -> List[Tuple[str, int]]:
    tasks = [("chief", 0)] if chief else []
    tasks += [("worker", i) for i in range(workers)]
    tasks += [("ps", i) for i in range(ps)]
    return tasks


def _pick_ports(n: int) -> List[int]:
    import portpicker

    ports: List[int] = []
    while len(ports) < n:
        p = portpicker.pick_unused_port()
        if p not in ports:
            ports.append(p)
    return ports


def _tf_configs(tasks: Sequence[Tuple[str, int]], hosts: Sequence[str], ports: Sequence[int]) -> List[dict]:
    cluster: Dict[str, List[str]] = {}
    for (ttype, _), host, port in zip(tasks, hosts, ports):
        cluster.setdefault(ttype, []).append(f"{host}:{port}")
    return [{"cluster": cluster, "task": {"type": t, "index": i}} for t, i in tasks]


# --------------------------------------------------------------------------------------------- network
def _run(cmd: Sequence[str]) -> None:
    p = subprocess.run(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        msg = " ".join(p.stdout.split()) or f"exit code {p.returncode}"
        raise ClusterError(f"network set-up failed: `{' '.join(cmd)}`: {msg}")


def _check_network_capability() -> None:
    if os.geteuid() != 0:
        raise ClusterError(
            "--bandwidth-mbit needs root (network namespaces and tc); run as root or drop the cap"
        )
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise ClusterError(
                f"--bandwidth-mbit needs the `{tool}` command (iproute2), which is not on PATH"
            )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _list_netns() -> List[str]:
    p = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def _reap_stale_namespaces() -> None:
    """Delete namespaces left by launchers that were SIGKILLed (their PID is in the name)."""
    for name in _list_netns():
        m = re.fullmatch(rf"{_NS_PREFIX}(\d+)-[\w-]+", name)
        if m and not _pid_alive(int(m.group(1))):
            subprocess.run(["ip", "netns", "del", name], stderr=subprocess.DEVNULL)


def tbf_params(bandwidth_mbit: float) -> Tuple[int, int, int]:
    """``(rate bit/s, burst bytes, limit bytes)`` of the token bucket that shapes a link to ``bandwidth_mbit``.

    burst = max(rate x ``TBF_BURST_S``, ``TBF_MIN_BURST``); limit = max(rate x ``TBF_LIMIT_S``,
    ``TBF_MIN_LIMIT``), rates in bytes/s. See the module docstring for why.

    >>> tbf_params(20)        # 20 Mbit/s: 2,500 B per ms < 4 frames
    (20000000, 6056, 250000)
    >>> tbf_params(1000)      # 1 Gbit/s
    (1000000000, 125000, 12500000)
    """
    rate_bit = max(1000, int(round(float(bandwidth_mbit) * 1e6)))
    rate_bytes = rate_bit / 8.0
    burst = max(int(round(rate_bytes * TBF_BURST_S)), TBF_MIN_BURST)
    limit = max(int(round(rate_bytes * TBF_LIMIT_S)), TBF_MIN_LIMIT)
    return rate_bit, burst, limit


def tbf_command(dev: str, bandwidth_mbit: float) -> List[str]:
    """The ``tc`` argv that shapes ``dev`` to ``bandwidth_mbit`` (sizes in bytes, as tc reads plain numbers).

    >>> " ".join(tbf_command("eth0", 20))
    'tc qdisc add dev eth0 root tbf rate 20000000bit burst 6056 limit 250000'
    """
    rate_bit, burst, limit = tbf_params(bandwidth_mbit)
    return [
        "tc",
        "qdisc",
        "add",
        "dev",
        dev,
        "root",
        "tbf",
        "rate",
        f"{rate_bit}bit",
        "burst",
        str(burst),
        "limit",
        str(limit),
    ]


class _Network:
    """Namespaces, links and qdiscs of one shaped cluster; ``close()`` removes them (idempotent)."""

    _serial = 0

    def __init__(self, num_tasks: int, bandwidth_mbit: float, topology: str):
        _check_network_capability()
        _Network._serial += 1
        self.base = f"{_NS_PREFIX}{os.getpid()}-{_Network._serial}"
        self.namespaces: List[str] = []
        self.topology = topology
        self.bandwidth_mbit = bandwidth_mbit
        self._closed = False
        atexit.register(self.close)
        try:
            _reap_stale_namespaces()
            if topology == "shared":
                self._shared(num_tasks)
            else:
                self._switch(num_tasks)
        except BaseException:
            self.close()
            raise

    def _add_ns(self, name: str) -> str:
        p = subprocess.run(
            ["ip", "netns", "add", name], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        if p.returncode != 0:
            raise ClusterError(
                f"cannot create network namespace {name!r} (`ip netns add`): "
                f"{' '.join(p.stdout.split()) or p.returncode}"
            )
        self.namespaces.append(name)
        return name

    def _tbf(self, ns: str, dev: str) -> None:
        _run(["ip", "netns", "exec", ns] + tbf_command(dev, self.bandwidth_mbit))

    def _sysctls(self, ns: str) -> None:
        for setting in SYSCTLS:
            _run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", setting])

    def _shared(self, n: int) -> None:
        ns = self._add_ns(f"{self.base}-shared")
        _run(["ip", "-n", ns, "link", "set", "lo", "mtu", "1500", "up"])
        self._sysctls(ns)
        self._tbf(ns, "lo")
        self.task_ns = [ns] * n
        self.hosts = ["127.0.0.1"] * n

    def _switch(self, n: int) -> None:
        sw = self._add_ns(f"{self.base}-sw")
        _run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", sw, "link", "set", "br0", "up"])
        self.task_ns, self.hosts = [], []
        for i in range(n):
            ns = self._add_ns(f"{self.base}-t{i}")
            ip = f"{SUBNET}.{i + 1}"
            _run(
                ["ip", "-n", sw, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0", "netns", ns]
            )
            _run(["ip", "-n", sw, "link", "set", f"p{i}", "mtu", "1500", "master", "br0", "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "mtu", "1500", "up"])
            self._sysctls(ns)
            self._tbf(ns, "eth0")  # task -> switch
            self._tbf(sw, f"p{i}")  # switch -> task
            self.task_ns.append(ns)
            self.hosts.append(ip)

    def wrap(self, i: int, command: List[str]) -> List[str]:
        return ["ip", "netns", "exec", self.task_ns[i]] + command

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for ns in reversed(self.namespaces):  # deleting a namespace removes its veths and qdiscs
            subprocess.run(["ip", "netns", "del", ns], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            atexit.unregister(self.close)
        except Exception:  # pragma: no cover
            pass


# ------------------------------------------------------------------------------------------- processes
def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: killed if the launcher dies
    except Exception:
        pass


def _group_has_live_process(pgid: int) -> bool:
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:  # pragma: no cover - no /proc: ask the kernel (zombies count as alive then)
        try:
            os.killpg(pgid, 0)
            return True
        except ProcessLookupError:
            return False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != b"Z":  # fields: state, ppid, pgrp, ...
            return True
    return False


def live_processes(token: str) -> List[Tuple[int, str]]:
    """``(pid, command line)`` of every live process (zombies excluded, this process excluded) whose
    command line contains ``token``: how tests and the stress runner check that nothing outlived a job.

    >>> live_processes("no process has this token in its command line 1f0c")
    []
    """
    found: List[Tuple[int, str]] = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if token in cmd and state != b"Z":
            found.append((int(pid), cmd))
    return found


def task_pid(marker: str, task_type: str, index: int) -> Optional[int]:
    """The pid of task ``task_type:index`` (read from its ``TF_CONFIG``) among the live processes whose
    command line or environment contains ``marker``: how the fault tests and benches pick a task to kill.

    >>> task_pid("no process carries this marker 7c1d", "worker", 1) is None
    True
    """
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if marker.encode() not in cmd and not any(marker.encode() in e for e in env):
            continue
        for e in env:
            if e.startswith(b"TF_CONFIG="):
                try:
                    task = json.loads(e[len("TF_CONFIG=") :]).get("task", {})
                except ValueError:
                    break
                if (task.get("type"), task.get("index")) == (task_type, index):
                    return int(pid)
    return None


class _Task:
    def __init__(
        self,
        name: str,
        argv: List[str],
        env: Dict[str, str],
        cwd: Optional[str],
        echo: Optional[TextIO],
        lock: threading.Lock,
        lines: Optional[List[str]] = None,
    ):
        self.name = name
        self.lines: List[str] = lines if lines is not None else []  # a restarted task goes on with its lines
        self.spec = (argv, env, cwd, echo, lock)  # to start it again (restart_workers)
        self.proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
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

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def group_alive(self) -> bool:
        """True while a live (non-zombie) process is in the task's process group."""
        return _group_has_live_process(self.pgid)

    def join_output(self, timeout: float = 5.0) -> None:
        self._reader.join(timeout)


def _kill_all(tasks: Sequence[_Task]) -> None:
    """SIGTERM every task's process group, then SIGKILL whatever is left after a grace period."""
    for t in tasks:
        t.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + _KILL_GRACE_S
    while time.monotonic() < deadline:
        for t in tasks:
            t.proc.poll()
        if not any(t.group_alive() for t in tasks):
            break
        time.sleep(0.05)
    for t in tasks:
        t.signal_group(signal.SIGKILL)
    for t in tasks:
        try:
            t.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass


class _Terminated(BaseException):
    """Raised in the main thread by the SIGTERM handler so every ``finally`` runs."""


def _exit_code(rc: int) -> int:
    return 128 - rc if rc < 0 else rc


# ------------------------------------------------------------------------------------------------- API
def _validate(
    command: Sequence[str],
    workers: int,
    ps: int,
    bandwidth_mbit: Optional[float],
    topology: str,
    timeout: Optional[float],
) -> None:
    if not command or not all(isinstance(c, str) for c in command):
        raise InputError("missing COMMAND (give it after --)", where="command")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InputError(f"must be an integer >= 1, got {workers!r}", where="--workers")
    if isinstance(ps, bool) or not isinstance(ps, int) or ps < 0:
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
    restart_workers: int = 0,
) -> ClusterResult:
    """Run ``command`` once per task of a local TF_CONFIG cluster and wait for it to finish.

    Example:
        >>> r = run_cluster(["sh", "-c", "exit 3"], workers=1, echo=False)
        >>> r.returncode, r.failed_task
        (3, 'worker:0')

    Args:
        command: argv run by every task (each gets its own ``TF_CONFIG``; ``PYTHONUNBUFFERED=1``).
        workers, ps, chief: the cluster's tasks (``chief:0``, ``worker:0..``, ``ps:0..``).
        bandwidth_mbit: shape the cluster's network to this rate (Mbit/s); None = plain loopback.
        topology: ``"switch"`` (a shaped link per task) or ``"shared"`` (one shaped loopback); only
            used with ``bandwidth_mbit``.
        timeout: seconds before every task is killed (returncode 124).
        env: extra environment variables for every task (on top of this process's environment).
        cwd: working directory of the tasks.
        echo: print each task's lines, prefixed ``[task:i] ``, as they come (to ``stream``, default stdout).
        threads_per_task: TensorFlow/OpenMP threads of each task (:mod:`tf_commopt.threads`); None = the
            machine's cores divided among the tasks, 0 = leave TensorFlow's defaults. Variables already
            set in ``env`` or this process's environment win. The inter-op pool always gets at least 2
            threads (1 deadlocks ParameterServerStrategy).
        tolerate_worker_failures: parameter-server clusters only (``ps`` >= 1 and ``chief``): a worker that
            exits non-zero does not end the cluster (the chief's ClusterCoordinator re-runs its work on
            the others); the run is done when the chief and every worker still counted have exited 0.
            Default False: any failed task ends the cluster, as before.
        restart_workers: parameter-server clusters only: start a dead worker again (same TF_CONFIG, same
            address), at most this many times in all, while the chief runs; implies
            ``tolerate_worker_failures``. Default 0.

    Returns:
        A ClusterResult; task failures are reported in it, not raised.

    Raises:
        InputError: bad arguments. ClusterError: the processes or the shaped network cannot be set up.
        KeyboardInterrupt / SystemExit(143): on Ctrl-C / SIGTERM, after every task is killed and the
        network removed.
    """
    _validate(command, workers, ps, bandwidth_mbit, topology, timeout)
    if isinstance(restart_workers, bool) or not isinstance(restart_workers, int) or restart_workers < 0:
        raise InputError(f"must be an integer >= 0, got {restart_workers!r}", where="--restart-workers")
    tolerant = bool(tolerate_worker_failures) or restart_workers > 0
    if tolerant and not (ps >= 1 and chief):
        flag = "--restart-workers" if restart_workers else "--tolerate-worker-failures"
        raise InputError(
            "only for parameter-server clusters (--ps >= 1 and --chief): a collective cluster cannot "
            "go on without one of its workers",
            where=flag,
        )
    if threads_per_task is not None and (
        isinstance(threads_per_task, bool) or not isinstance(threads_per_task, int) or threads_per_task < 0
    ):
        raise InputError(
            f"must be an integer >= 0 or None, got {threads_per_task!r}", where="threads_per_task"
        )
    out = (stream or sys.stdout) if echo else None
    specs = _task_names(workers, ps, chief)
    names = [f"{t}:{i}" for t, i in specs]
    lock = threading.Lock()
    tasks: List[_Task] = []
    net: Optional[_Network] = None
    old_term = None
    in_main = threading.current_thread() is threading.main_thread()
    if in_main:

        def _on_term(signum, frame):
            raise _Terminated()

        old_term = signal.signal(signal.SIGTERM, _on_term)
    start = time.monotonic()
    returncode, failed, timed_out, message = 0, None, False, ""
    failed_signal: Optional[int] = None
    worker_failures: List[str] = []
    given_up: set = set()
    restarts = 0
    try:
        if bandwidth_mbit is not None:
            net = _Network(len(specs), float(bandwidth_mbit), topology)
            hosts = net.hosts
        else:
            hosts = ["127.0.0.1"] * len(specs)
        configs = _tf_configs(specs, hosts, _pick_ports(len(specs)))
        base_env = dict(os.environ)
        base_env.update(env or {})
        base_env.setdefault("PYTHONUNBUFFERED", "1")
        if threads_per_task != 0:
            for var, value in thread_env(len(specs), per_task=threads_per_task).items():
                base_env.setdefault(var, value)  # at least 2 inter-op threads: 1 deadlocks ps clusters
        for i, (name, cfg) in enumerate(zip(names, configs)):
            task_env = dict(base_env, TF_CONFIG=json.dumps(cfg))
            argv = net.wrap(i, list(command)) if net else list(command)
            try:
                tasks.append(_Task(name, argv, task_env, cwd, out, lock))
            except OSError as e:
                raise ClusterError(f"cannot start task {name}: {command[0]}: {e.strerror or e}") from None
        deadline = None if timeout is None else start + float(timeout)
        finishers = [t for t in tasks if not t.name.startswith("ps:")]
        while True:
            for k, t in enumerate(tasks):
                rc = t.proc.poll()
                if t.name in given_up:  # a dead worker the run goes on without
                    continue
                if (
                    tolerant
                    and rc is not None
                    and rc != 0
                    and t.name.startswith("worker:")
                    and failed is None
                ):
                    worker_failures.append(f"{t.name} exit {_exit_code(rc)}")
                    chief_up = any(c.proc.poll() is None for c in tasks if c.name.startswith("chief:"))
                    t.signal_group(signal.SIGKILL)  # whatever the dead worker left in its group
                    t.join_output()
                    if restarts < restart_workers and chief_up:
                        restarts += 1
                        note = f"{t.name} exited with code {_exit_code(rc)}; restarting it ({restarts}/{restart_workers})"
                        tasks[k] = _Task(t.name, *t.spec, lines=t.lines)
                        finishers = [q for q in tasks if not q.name.startswith("ps:")]
                    else:
                        given_up.add(t.name)
                        note = f"{t.name} exited with code {_exit_code(rc)}; going on without it"
                    if out is not None:
                        with lock:
                            out.write(f"tf_commopt.cluster: {note}\n")
                            out.flush()
                    continue
                if rc is not None and rc != 0 and failed is None:
                    failed, returncode = t.name, _exit_code(rc)
                    failed_signal = -rc if rc < 0 else None
                    message = f"task {failed} failed with exit code {returncode}"
            if failed is not None:
                break
            if all(t.proc.poll() == 0 or t.name in given_up for t in finishers):
                message = f"all {len(finishers)} task(s) finished"
                if worker_failures:
                    message += f" ({len(worker_failures)} worker failure(s) tolerated, {restarts} restart(s))"
                break
            if deadline is not None and time.monotonic() > deadline:
                timed_out, returncode = True, 124
                running = [t.name for t in finishers if t.proc.poll() is None]
                message = f"timeout after {timeout:g} s; still running: {', '.join(running)}"
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        message = "interrupted"
        raise
    except _Terminated:
        message = "terminated"
        raise SystemExit(128 + signal.SIGTERM) from None
    finally:
        old_int = None
        if in_main:  # a second Ctrl-C / SIGTERM must not cut the clean-up short
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            _kill_all(tasks)
            for t in tasks:
                t.join_output()
            if net is not None:
                net.close()
        finally:
            if in_main:
                signal.signal(signal.SIGTERM, old_term if old_term is not None else signal.SIG_DFL)
                signal.signal(signal.SIGINT, old_int if old_int is not None else signal.default_int_handler)
    wall = time.monotonic() - start
    result = ClusterResult(
        returncode,
        {t.name: list(t.lines) for t in tasks},
        wall,
        failed,
        timed_out,
        dict(zip(names, configs)),
        message,
        failed_signal,
        worker_failures,
        restarts,
    )
    return result


# ------------------------------------------------------------------------------------------------- CLI
class _OneLineParser(CliParser):
    def error(self, message: str):  # one line on stderr, exit 2 (argparse prints the usage otherwise)
        sys.stderr.write(f"tf_commopt.cluster: error: {' '.join(message.split())}\n")
        sys.exit(2)


def _positive_float(unit: str):
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of {unit}") from None
        if not (math.isfinite(v) and v > 0):
            raise argparse.ArgumentTypeError(f"{text!r} must be a number of {unit} > 0")
        return v

    return parse


def _parser() -> argparse.ArgumentParser:
    p = _OneLineParser(
        prog="python -m tf_commopt.cluster",
        usage="python -m tf_commopt.cluster [options] -- COMMAND [ARG ...]",
        description="Run COMMAND once per task of a local TF_CONFIG cluster.",
        epilog="Example: python -m tf_commopt.cluster --workers 2 --bandwidth-mbit 100 -- "
        "python -m experiments.train --steps=20. Flags may also be spelled with "
        "underscores (--bandwidth_mbit).",
    )
    p.add_argument("--workers", type=int, default=2, help="worker tasks (>= 1)")
    p.add_argument("--ps", type=int, default=0, help="parameter-server tasks")
    p.add_argument("--chief", action="store_true", help="add a chief task")
    p.add_argument(
        "--bandwidth-mbit",
        type=_positive_float("Mbit/s"),
        default=None,
        help="shape the cluster's network to R Mbit/s with tc tbf (root)",
    )
    p.add_argument(
        "--topology",
        default=None,
        choices=TOPOLOGIES,
        help="with --bandwidth-mbit: switch (a shaped link per task; the default) or shared (one "
        "shaped loopback for all)",
    )
    p.add_argument(
        "--timeout", type=_positive_float("seconds"), default=None, help="kill every task after S seconds"
    )
    p.add_argument("--quiet", action="store_true", help="do not echo the tasks' output")
    p.add_argument(
        "--threads-per-task",
        type=int,
        default=None,
        help="TensorFlow/OpenMP threads per task (default: the cores divided among the tasks; "
        "0 = TensorFlow's defaults)",
    )
    p.add_argument(
        "--tolerate-worker-failures",
        action="store_true",
        help="ps clusters (--ps >= 1 --chief): go on when a worker dies (its work is re-run on the others)",
    )
    p.add_argument(
        "--restart-workers",
        type=int,
        default=0,
        metavar="N",
        help="ps clusters: start a dead worker again, at most N times in all (implies "
        "--tolerate-worker-failures)",
    )
    add_tf_log_level(p)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI: ``python -m tf_commopt.cluster --workers N [...] -- COMMAND ...``; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(
            signal.SIGINT, signal.default_int_handler
        )  # Ctrl-C works even if started with SIGINT ignored
    parser = _parser()
    if "--" in argv:
        k = argv.index("--")
        opts, command = argv[:k], argv[k + 1 :]
    else:
        opts, command = argv, []
    if any(a in ("-h", "--help") for a in opts):
        parser.print_help()
        return 0
    args = parser.parse_args(opts)
    if not command:
        parser.error("missing COMMAND: give it after --, e.g. -- python -m experiments.train")
    if args.workers < 1:
        parser.error(f"argument --workers: must be >= 1, got {args.workers}")
    if args.ps < 0:
        parser.error(f"argument --ps: must be >= 0, got {args.ps}")
    if args.threads_per_task is not None and args.threads_per_task < 0:
        parser.error(f"argument --threads-per-task: must be >= 0, got {args.threads_per_task}")
    if args.topology is not None and args.bandwidth_mbit is None:
        parser.error("argument --topology: only with --bandwidth-mbit (an unshaped cluster has no topology)")
    quiet_tensorflow(args.tf_log_level)  # the tasks inherit $TF_CPP_MIN_LOG_LEVEL
    try:
        r = run_cluster(
            command,
            workers=args.workers,
            ps=args.ps,
            chief=args.chief,
            bandwidth_mbit=args.bandwidth_mbit,
            topology=args.topology or "switch",
            timeout=args.timeout,
            echo=not args.quiet,
            threads_per_task=args.threads_per_task,
            tolerate_worker_failures=args.tolerate_worker_failures,
            restart_workers=args.restart_workers,
        )
    except (InputError, ClusterError) as e:
        sys.stderr.write(f"tf_commopt.cluster: error: {e}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("tf_commopt.cluster: interrupted; every task was killed\n")
        return 130
    if r.returncode != 0:
        how = f" (killed by signal {r.failed_signal})" if r.failed_signal else ""
        sys.stderr.write(f"tf_commopt.cluster: {r.message}{how}\n")
        show = r.failed_task or next((n for n, lines in r.outputs.items() if lines), None)
        if show:
            sys.stderr.write(f"--- last lines of {show} ---\n")
            for line in r.last_lines(show) or ["(no output)"]:
                sys.stderr.write(f"[{show}] {line}\n")
    else:
        sys.stderr.write(f"tf_commopt.cluster: {r.message} in {r.wall_s:.1f} s\n")
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
