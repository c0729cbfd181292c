"""Chaos bench: skip-and-correct on a local cluster run by ``tf_commopt.cluster --max-restarts``, with
workers killed at moments the bench picks, against the uninterrupted run. Page: docs/results/chaos.md (:mod:`experiments.chaos_page`).

Variants, interleaved within each repeat (the same runner flags and backups, deterministic data order):

* ``uninterrupted`` — nothing killed: the reference.
* ``chaos`` — three SIGKILLs, one per attempt: a worker while it writes a backup (it waits between the
  write and the rename), a worker blocked inside a sync's all-reduce (another worker waits before that
  step), and a random worker a random time after the third attempt's first step (seeded).
* ``preempted`` — SIGTERM to a random worker before a random step: every worker backs up at the next
  sync and exits 143; the launcher starts them all again.
* ``no_backups`` — the run without a backup directory: what the backups cost.

Each run records the largest difference of its final weights from the uninterrupted run of the same
repeat, its test accuracy, and per failure the time it cost (from the write of the backup it resumed
from to the first step after the restart), split into the work redone (backup to kill) and the restart
(kill to first step; for SIGTERM: the backup to the first step).

Example::

    python -m experiments.chaos_bench --repeats=1 --out=/tmp/chaos.jsonl
    python -m experiments.chaos_bench --repeats=3 --out=docs/results/chaos.jsonl
"""

from __future__ import annotations

import functools
import json
import os
import queue
import random
import signal
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional

from experiments import _cli
from experiments.harness import ROOT, Launch, Sweep, run_sweep

__all__ = [
    "Kill",
    "chaos_plan",
    "preempt_plan",
    "run_with_faults",
    "final_weights",
    "max_weight_diff",
]

VARIANTS = ("uninterrupted", "chaos", "preempted", "no_backups")
_REFERENCE: Dict[str, Dict[str, Any]] = {}  # setting -> the last uninterrupted run's weights and timings


@dataclass(frozen=True)
class Kill:
    """One fault: ``phase`` ``backup`` / ``sync`` (SIGKILL at a held moment), ``random`` (SIGKILL
    ``delay_s`` after the attempt's first step), ``step`` (SIGKILL ``delay_s`` after ``step`` started) or
    ``term`` (SIGTERM before ``step``), in ``attempt``."""

    phase: str
    attempt: int
    victim: int
    step: int = 0
    holder: int = -1
    delay_s: float = 0.0

    def hold_spec(self) -> Optional[str]:
        """Its ``$TF_COMMOPT_CHAOS_HOLD`` entry (None for a random kill)."""
        if self.phase == "random":
            return None
        who = self.victim if self.phase in ("backup", "term", "step") else self.holder
        return f"{self.phase}:worker-{who}:{self.step}:{self.attempt}"


def chaos_plan(seed: int, workers: int, every: int, interval: int, by_step: bool = False) -> List[Kill]:
    """The ``chaos`` variant's three SIGKILLs: inside the second backup write (attempt 0), inside a sync a
    backup period after the resume (attempt 1), at a random moment (attempt 2): 0.5-3 s after its first
    step, or with ``by_step`` up to 0.1 s after a random step of the backup period after its resume
    (sure to come before the end of a run of more than three backup periods, however fast its steps).

    Example:
        >>> [k.phase for k in chaos_plan(1, 2, 16, 8, by_step=True)]
        ['backup', 'sync', 'step']
    """
    rng = random.Random(seed)
    w = list(range(workers))
    held = Kill("backup", 0, rng.choice(w), step=2 * every)
    holder, victim = rng.sample(w, 2)
    sync_step = (2 * every // interval + 1) * interval  # attempt 1 resumes at `every`, backs up at 2·every
    in_sync = Kill("sync", 1, victim, step=sync_step, holder=holder)
    if by_step:  # attempt 2 resumes at 2·every
        step = rng.randrange(2 * every + 2, 3 * every)
        return [
            held,
            in_sync,
            Kill("step", 2, rng.choice(w), step=step, delay_s=round(rng.uniform(0, 0.1), 2)),
        ]
    return [held, in_sync, Kill("random", 2, rng.choice(w), delay_s=round(rng.uniform(0.5, 3.0), 2))]


def preempt_plan(seed: int, workers: int, total_steps: int) -> List[Kill]:
    """The ``preempted`` variant: SIGTERM to a random worker before a random step of the middle half."""
    rng = random.Random(seed)
    return [
        Kill("term", 0, rng.randrange(workers), step=rng.randrange(total_steps // 4, 3 * total_steps // 4))
    ]


class _Faults:
    """run_cluster's stream: hands each line to a thread that carries out the kills when their moment
    comes (never blocking the launcher's readers)."""

    def __init__(self, token: str, kills: List[Kill]):
        self.token, self.kills, self.done = token, list(kills), []
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def write(self, text: str) -> None:
        for line in text.splitlines():
            self.lines.put(line)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.lines.put(None)
        self.thread.join(10)

    def _signal(self, kill: Kill, sig: int) -> None:
        from tf_commopt.cluster import task_pid

        pid = task_pid(f"CHAOS_TOKEN={self.token}", "worker", kill.victim)
        if pid is not None:
            os.kill(pid, sig)
            self.done.append(dict(asdict(kill), t=time.time()))

    def _moment(self, k: Kill, body: str) -> bool:
        """Whether ``body`` (a task's line) is the moment of fault ``k``."""
        if k.phase == "backup":
            return body == f"CHAOS holding worker-{k.victim} in backup {k.step}"
        if k.phase == "sync":
            return body == f"CHAOS holding worker-{k.holder} in sync {k.step}"
        if k.phase in ("term", "step"):  # the line may follow a progress bar's (no newline)
            return body.endswith(f"CHAOS at {k.phase} {k.step} (worker-{k.victim})")
        return body.startswith("CHAOS training from step") and body.endswith(
            f"(worker-0, attempt {k.attempt})"
        )

    def _run(self) -> None:
        pending = list(self.kills)
        while pending:
            line = self.lines.get()
            if line is None:
                return
            k = pending[0]
            if not self._moment(k, line.split("] ", 1)[-1]):
                continue
            if k.phase == "term":  # the worker sent itself SIGTERM
                self.done.append(dict(asdict(k), t=time.time()))
            else:
                time.sleep(1.0 if k.phase == "sync" else k.delay_s)  # sync: the victim reaches its all-reduce
                self._signal(k, signal.SIGKILL)
            pending.pop(0)


def run_with_faults(argv: List[str], workers: int, kills: List[Kill], max_restarts: int, timeout: float):
    """Run the runner on a ``workers``-worker cluster with ``max_restarts`` and the given faults; returns
    (ClusterResult, the faults carried out with their Unix time ``t``, the Unix time of the start)."""
    from tf_commopt.cluster import run_cluster

    token = uuid.uuid4().hex
    specs = [s for s in (k.hold_spec() for k in kills) if s]
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ROOT, "CHAOS_TOKEN": token}
    if specs:
        env["TF_COMMOPT_CHAOS_HOLD"] = ",".join(specs)
    faults = _Faults(token, kills)
    t0 = time.time()
    try:
        r = run_cluster(
            [sys.executable, "-m", "experiments.train", *argv],
            workers=workers,
            timeout=timeout,
            cwd=ROOT,
            env=env,
            echo=True,
            stream=faults,
            max_restarts=max_restarts,
        )
    finally:
        faults.close()
    return r, faults.done, t0


def final_weights(model_dir: str) -> Dict[str, Any]:
    """The layers' weights the chief wrote to ``model_dir``."""
    import h5py
    import numpy as np

    out: Dict[str, Any] = {}
    with h5py.File(os.path.join(model_dir, "model.weights.h5"), "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, np.array(o)) if isinstance(o, h5py.Dataset) else None)
    return out


def max_weight_diff(a: Dict[str, Any], b: Dict[str, Any]) -> float:
    """The largest absolute difference between two sets of weights (inf if their layout differs)."""
    import numpy as np

    if sorted(a) != sorted(b) or any(a[k].shape != b[k].shape for k in a):
        return float("inf")
    return float(max(np.abs(a[k] - b[k]).max() for k in a))


def _ledger(backup_dir: str) -> List[Dict[str, Any]]:
    try:
        with open(os.path.join(backup_dir, "worker-0", "ledger.jsonl"), encoding="utf-8") as f:
            return [json.loads(x) for x in f if x.strip()]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


# -------------------------------------------------------------------------------------------------- runs
KEEP = ("steps", "wall_s", "test_accuracy", "train_loss", "restarts", "resumed_at_step", "lost_s", "syncs")


def _failures(
    resumes: List[Dict[str, Any]],
    done: List[Dict[str, Any]],
    ref: Optional[Dict[str, Any]],
    every: int,
    planned: List[str] = (),  # type: ignore[assignment]
):
    """One row per fault: the resume it caused and the time it cost, against the goal (start-up +
    one backup period of the uninterrupted run)."""
    rows = []
    for i, res in enumerate(resumes):  # a fault whose moment the bench missed still has its resume
        k = done[i] if i < len(done) else {"phase": planned[i] if i < len(planned) else "?"}
        kill_t, from_t, first_t = k.get("t"), res.get("from_t"), res.get("first_t")
        row = {"phase": k["phase"], "attempt": res.get("attempt"), "resumed_at": res.get("step")}
        row["lost_s"] = res.get("lost_s")
        if None not in (kill_t, from_t, first_t):
            row["redone_s"] = round(max(0.0, kill_t - from_t), 3)
            row["restart_s"] = round(first_t - max(kill_t, from_t), 3)
        if ref is not None and row["lost_s"] is not None:
            row["goal_s"] = round(ref["startup_s"] + every * ref["step_s"], 3)
            row["met"] = row["lost_s"] <= row["goal_s"]
        rows.append(row)
    return rows


def _run_variant(variant: str, setting: str, every: int, seed: int, plan: Any, run: Launch) -> Dict[str, Any]:
    """A :class:`Launch` runner: one run of ``variant`` with its faults, measured against the last
    uninterrupted run of ``setting``."""
    import shutil

    tmp = tempfile.mkdtemp(prefix="chaos-")
    try:
        argv = list(run.argv) + [f"--model_dir={tmp}/model"]
        if variant == "no_backups":
            argv = [a for a in argv if not a.startswith("--backup_every")]
        else:
            argv.append(f"--backup_dir={tmp}/backup")
        kills = plan(seed) if plan is not None else []
        restarts = 0 if variant == "no_backups" else 3  # no launcher backup directory either
        r, done, t0 = run_with_faults(argv, run.workers, kills, max_restarts=restarts, timeout=run.timeout)
        recs = [json.loads(x) for x in r.outputs.get("worker:0", []) if x.startswith("{")]
        if r.returncode != 0 or not recs:
            tail = "\n".join(f"[{t}] {x}" for t in r.outputs for x in r.last_lines(t, 8))
            raise RuntimeError(f"{variant}: {r.message}\n{tail}")
        rec, weights = recs[-1], final_weights(f"{tmp}/model")
        if variant == "uninterrupted":
            firsts = [e["t"] for e in _ledger(f"{tmp}/backup") if e["event"] == "first_step"]
            startup = round(firsts[0] - t0, 3) if firsts else None
            step_s = rec["wall_s"] / max(1, rec["steps"])
            _REFERENCE[setting] = {"weights": weights, "startup_s": startup, "step_s": step_s}
        ref = _REFERENCE.get(setting)
        out = {k: rec[k] for k in KEEP if k in rec}
        out.update(variant=variant, seed=seed, cluster_wall_s=round(r.wall_s, 2), cluster_restarts=r.restarts)
        out["max_weight_diff"] = max_weight_diff(weights, ref["weights"]) if ref else None
        if variant == "uninterrupted":
            out.update(startup_s=ref["startup_s"], step_s=round(ref["step_s"], 4))
        out["faults"] = _failures(
            rec.get("resumes", []),
            done,
            ref if ref and ref["startup_s"] else None,
            every,
            [k.phase for k in kills],
        )
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def define(fv: Any) -> None:
    from absl import flags

    d = dict(flag_values=fv)
    flags.DEFINE_integer("workers", 4, "workers of the collective cluster", **d)
    flags.DEFINE_string("model", "mlp", "the runner's --model", **d)
    flags.DEFINE_integer("interval", 8, "H, steps between syncs", **d)
    flags.DEFINE_integer("epochs", 3, "epochs", **d)
    flags.DEFINE_integer("steps_per_epoch", 60, "global steps per epoch", **d)
    flags.DEFINE_integer("backup_every", 20, "the runner's --backup_every", **d)
    flags.DEFINE_integer("repeats", 2, "repeats (variants interleaved in each)", **d)
    flags.DEFINE_integer("seed", 0, "seed of the first repeat's fault moments (repeat i: seed + i)", **d)
    flags.DEFINE_string("only", "", "comma-separated variants (default: all)", **d)
    flags.DEFINE_string("out", "", "append the record here", **d)


def _argv(fv: Any) -> List[str]:
    return [
        "--strategy=skip_correct",
        f"--interval={fv.interval}",
        f"--model={fv.model}",
        f"--epochs={fv.epochs}",
        f"--steps_per_epoch={fv.steps_per_epoch}",
        "--batch_size=32",
        f"--backup_every={fv.backup_every}",
    ]


def _body(fv: Any) -> int:
    variants = fv.only.split(",") if fv.only else list(VARIANTS)
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        _cli.fail(f"--only: unknown variant(s) {', '.join(bad)}; choose from {', '.join(VARIANTS)}")
    total = fv.epochs * fv.steps_per_epoch
    if fv.workers < 2 or total < 4 * fv.backup_every or fv.backup_every < fv.interval:
        _cli.fail("needs --workers >= 2, --backup_every >= --interval and 4 backup periods of steps at least")
    setting = f"{fv.model}, {fv.workers} workers, H = {fv.interval}"
    plans = {
        "chaos": lambda seed: chaos_plan(seed, fv.workers, fv.backup_every, fv.interval),
        "preempted": lambda seed: preempt_plan(seed, fv.workers, total),
    }
    calls: Dict[str, int] = {}

    def launch(s: str, v: str) -> Launch:
        calls[v] = calls.get(v, 0) + 1
        runner = functools.partial(_run_variant, v, s, fv.backup_every, fv.seed + calls[v] - 1, plans.get(v))
        return Launch(_argv(fv), workers=fv.workers, timeout=1800.0, runner=runner)

    describe = dict(workers=fv.workers, model=fv.model, interval=fv.interval, epochs=fv.epochs)
    describe.update(steps_per_epoch=fv.steps_per_epoch, backup_every=fv.backup_every, seed=fv.seed)
    sweep = Sweep("chaos", [setting], variants, fv.repeats, launch, extra=describe)
    run_sweep(sweep, fv.out, _cli.command(fv))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m experiments.chaos_bench`` in process; returns the exit code."""
    return _cli.main("experiments.chaos_bench", argv, define, _body)


if __name__ == "__main__":
    raise SystemExit(main())
