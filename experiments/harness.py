"""The bench harness: a bench is a sweep declared as data (settings x variants x repeats) of runner
launches; the harness runs it, records one JSON line per setting (with the machine load and the exact
command) and the report module renders the page.

A :class:`Launch` is one run of the runner (``python -m experiments.train <argv>``) on a local
``tf_commopt.cluster`` cluster (or, with ``workers=0``, as one local process); :func:`launch` returns
the chief's JSON record. :class:`Sweep` declares which launch each (setting, variant) is, which keys of
a run's record to keep and how to summarize a setting; :func:`run_sweep` runs the variants of a setting
interleaved, ``repeats`` times, and appends the setting's record to the .jsonl.

Example:
    >>> sweep = Sweep("demo", settings=["mlp"], variants=["ssgd", "skip_correct"], repeats=1,
    ...               launch=lambda s, v: Launch([f"--model={s}", f"--strategy={v}", "--steps=20"]))
    >>> [r["setting"] for r in run_sweep(sweep, "", "python -m ...")]      # doctest: +SKIP
    ['mlp']
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

__all__ = [
    "ROOT",
    "Launch",
    "Sweep",
    "launch",
    "run_sweep",
    "machine",
    "append_jsonl",
    "cluster_lines",
    "json_lines",
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNER = "experiments.train"


@dataclass
class Launch:
    """One run: ``python -m <module> <argv>`` on every task of a local cluster.

    ``workers=0``: one local process, no TF_CONFIG. ``mbit``: shape every link (None = plain loopback).
    ``kill_worker_on``: SIGKILL worker 1 once the chief (or worker 0) prints a line starting with it; the
    cluster then tolerates the failure (parameter-server clusters only). ``runner``: a function that runs
    the launch itself and returns its record (a bench that injects faults of its own).
    """

    argv: List[str]
    workers: int = 2
    mbit: Optional[float] = None
    topology: str = "switch"
    tasks_per_host: int = 1  # consecutive tasks sharing a host (unshaped between them)
    ps: int = 0
    chief: bool = False
    module: str = RUNNER
    kill_worker_on: Optional[str] = None
    timeout: float = 1800.0
    all_tasks: bool = False  # keep every task's record (``task`` added), not only the chief's
    runner: Optional[Callable[["Launch"], Dict[str, Any]]] = None  # runs it instead (e.g. with faults)


@dataclass
class Sweep:
    """A bench as data: ``launch(setting, variant)`` for every setting x variant, ``repeats`` times."""

    bench: str
    settings: Sequence[str]
    variants: Sequence[str]
    repeats: int
    launch: Callable[[str, str], Launch]
    keep: Sequence[str] = ()  # keys kept from each run's record (all when empty)
    describe: Callable[[str], Dict[str, Any]] = lambda setting: {}
    summarize: Callable[[str, Dict[str, List[Dict[str, Any]]]], Dict[str, Any]] = lambda s, runs: {}
    extra: Dict[str, Any] = field(default_factory=dict)  # fields every record of the sweep carries
    reduce: Callable[[Dict[str, Any]], Dict[str, Any]] = lambda rec: rec  # a launch's result -> one run


def machine() -> Dict[str, Any]:
    """When, the 1-minute load average and the core count: what a timing record must carry."""
    return {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "cores": os.cpu_count(),
    }


def append_jsonl(path: str, record: Dict[str, Any]) -> None:
    """Append ``record`` as one line to ``path`` (nothing when ``path`` is empty)."""
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def json_lines(lines: Sequence[str]) -> List[Dict[str, Any]]:
    """The JSON objects among ``lines`` (``RESULT {...}`` or ``{...}``)."""
    out = []
    for line in lines:
        text = line[7:] if line.startswith("RESULT ") else line
        if text.startswith("{") and text.rstrip().endswith("}"):
            try:
                out.append(json.loads(text))
            except json.JSONDecodeError:
                pass
    return out


class _Killer:
    """run_cluster's stream: SIGKILL worker 1 when a chief/worker-0 line starts with ``trigger``."""

    def __init__(self, token: str, trigger: Optional[str]):
        self.token, self.trigger, self.killed_at, self.t0 = token, trigger, None, time.monotonic()

    def write(self, text: str) -> None:
        from tf_commopt.cluster import task_pid

        for line in text.splitlines():
            body = line.split("] ", 1)[-1]
            if self.trigger and self.killed_at is None and body.startswith(self.trigger):
                pid = task_pid(f"HARNESS_TOKEN={self.token}", "worker", 1)
                if pid:
                    os.kill(pid, signal.SIGKILL)
                    self.killed_at = round(time.monotonic() - self.t0, 2)

    def flush(self) -> None:
        pass


def _local(run: Launch) -> Dict[str, Any]:
    cmd = [sys.executable, "-m", run.module, *run.argv]
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    env.pop("TF_CONFIG", None)
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=run.timeout)
    recs = json_lines(p.stdout.splitlines())
    if p.returncode != 0 or not recs:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return dict(recs[-1], ok=True)


def cluster_lines(run: Launch) -> tuple:
    """Run ``run`` on a cluster: (ClusterResult, the killer's kill time or None)."""
    from tf_commopt.cluster import run_cluster

    token = uuid.uuid4().hex
    killer = _Killer(token, run.kill_worker_on)
    r = run_cluster(
        [sys.executable, "-m", run.module, *run.argv],
        workers=run.workers,
        ps=run.ps,
        chief=run.chief,
        bandwidth_mbit=run.mbit or None,
        topology=run.topology,
        timeout=run.timeout,
        cwd=ROOT,
        env={"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ROOT, "HARNESS_TOKEN": token},
        echo=run.kill_worker_on is not None,
        stream=killer if run.kill_worker_on else None,
        tolerate_worker_failures=run.kill_worker_on is not None,
        tasks_per_host=run.tasks_per_host,
    )
    return r, killer.killed_at


def launch(run: Launch) -> Dict[str, Any]:
    """The chief's record of one run (with ``cluster_wall_s``; ``killed_at_s`` when a worker was killed);
    with ``all_tasks``, ``{"tasks": [record of each task, with its task]}``. RuntimeError with the
    tasks' last lines when the run failed."""
    if run.runner is not None:
        return run.runner(run)
    if run.workers == 0:
        return _local(run)
    r, killed_at = cluster_lines(run)
    lead = "chief:0" if run.chief else "worker:0"
    recs = {t: json_lines(lines) for t, lines in r.outputs.items()}
    if r.returncode != 0 or not recs.get(lead):
        tail = "\n".join(f"[{t}] {x}" for t in r.outputs for x in r.last_lines(t, 8))
        raise RuntimeError(f"{' '.join(run.argv)}: {r.message}\n{tail}")
    info = {"cluster_wall_s": round(r.wall_s, 2), "ok": r.ok}
    if run.kill_worker_on is not None:
        info.update(killed_at_s=killed_at, worker_failures=r.worker_failures)
    if run.all_tasks:
        return dict(info, tasks=[dict(x[-1], task=t) for t, x in sorted(recs.items()) if x])
    return dict(recs[lead][-1], **info)


def run_sweep(
    sweep: Sweep, out: str, command: str, echo: Callable[[str], None] = print
) -> List[Dict[str, Any]]:
    """Run every setting of ``sweep`` (variants interleaved within each repeat), append one record per
    setting to ``out`` and return the records."""
    records = []
    for setting in sweep.settings:
        runs: Dict[str, List[Dict[str, Any]]] = {v: [] for v in sweep.variants}
        for rep in range(sweep.repeats):
            for v in sweep.variants:
                rec = sweep.reduce(launch(sweep.launch(setting, v)))
                runs[v].append({k: rec[k] for k in sweep.keep if k in rec} if sweep.keep else rec)
                shown = {k: rec[k] for k in ("wall_s", "test_accuracy", "interval", "step_ms") if k in rec}
                echo(f"  {setting} repeat {rep + 1}/{sweep.repeats} {v}: {json.dumps(shown)}")
        record = {"bench": sweep.bench, "setting": setting, **sweep.describe(setting), **sweep.extra}
        record.update(repeats=sweep.repeats, runs=runs, **sweep.summarize(setting, runs))
        record.update(command=command, **machine())
        echo(json.dumps({k: v for k, v in record.items() if k != "runs"}))
        append_jsonl(out, record)
        records.append(record)
    return records
