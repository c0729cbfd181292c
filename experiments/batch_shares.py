"""The runner's ``--batch_shares`` for batch balancing: by speed, or measured by a calibration.

Batch balancing needs each worker's share of the per-worker batch. :func:`speed_shares` gives a worker k
times slower 1/k, which assumes a step's time is proportional to its batch; it is not (a step has a fixed
part), so :func:`calibrate_shares` measures instead, as the partitioner's profiles do: two short runs on
the same cluster without a sync (local steps only, four per call), one at the full per-worker batch B
and one at B/2, each worker's median seconds per step from its record (``step_ms``: calls after the
tenth step), then :func:`tf_commopt.core.shares.equal_time_shares`. The calibration is paid once per
cluster and model, like a profile, not by every training run:

    python -m experiments.batch_shares --model=cnn --batch_size=512 --workers=4 --slow_workers=0:4,1:8,2:4,3:8
    # prints the calibration as one JSON line; its batch_shares go to the runner's --batch_shares

Example:
    >>> speed_shares("1:2.0,3:2.0", 4), speed_shares("", 2)
    ('1,0.5,1,0.5', '1,1')
    >>> calibration_argv("cnn", 512, 64, "0:4,1:8")[:4]
    ['--model=cnn', '--steps=64', '--batch_size=512', '--strategy=skip_correct']
    >>> per_step_seconds({"tasks": [{"task": "worker:1", "step_ms": 100.0},
    ...                             {"task": "worker:0", "step_ms": 50.0}]}, 2)
    [0.05, 0.1]
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Optional

from experiments import _cli
from experiments.harness import Launch, launch
from experiments.slow import parse_slow_workers
from tf_commopt.core.shares import equal_time_shares, format_shares

__all__ = ["speed_shares", "calibration_argv", "per_step_seconds", "calibrate_shares", "main"]

STEPS = 64  # per calibration run: 16 calls of four local steps, the last 13 timed


def speed_shares(slowed: str, workers: int) -> str:
    """Each worker's share is its speed, 1 / its factor in ``slowed`` (``--slow_workers`` text)."""
    factors = parse_slow_workers(slowed)
    return ",".join(f"{1.0 / factors.get(w, 1.0):g}" for w in range(workers))


def calibration_argv(model: str, global_batch: int, steps: int, slow: str) -> List[str]:
    """The runner's flags of one calibration run: local steps only (H beyond the run), four per call,
    every worker's step times kept."""
    argv = [f"--model={model}", f"--steps={steps}", f"--batch_size={global_batch}"]
    argv += ["--strategy=skip_correct", f"--interval={steps + 1}", "--steps_per_execution=4", "--step_times"]
    return argv + ([f"--slow_workers={slow}"] if slow else [])


def per_step_seconds(record: Dict[str, Any], workers: int) -> List[float]:
    """Each worker's median seconds per step (worker order) from an ``all_tasks`` launch's record."""
    out: Dict[int, float] = {}
    for task in record["tasks"]:
        index = int(task["task"].rsplit(":", 1)[1])
        out[index] = float(task["step_ms"]) / 1e3
    missing = [w for w in range(workers) if w not in out]
    if missing:
        raise RuntimeError(f"calibration: no record from worker(s) {missing}")
    return [out[w] for w in range(workers)]


def calibrate_shares(
    model: str,
    global_batch: int,
    workers: int,
    slow: str = "",
    mbit: Optional[float] = None,
    steps: int = STEPS,
    run: Callable[[Launch], Dict[str, Any]] = launch,
) -> Dict[str, Any]:
    """Two calibration runs (the full and the half per-worker batch) and the shares they give.

    Returns ``{"batch_shares": "1,0.4,...", "t_full_ms": [...], "t_half_ms": [...], "per_worker_batch": B,
    "steps": steps}``.
    """
    per_worker = global_batch // workers
    times = []
    for batch in (per_worker, per_worker // 2):
        argv = calibration_argv(model, batch * workers, steps, slow)
        times.append(per_step_seconds(run(Launch(argv, workers=workers, mbit=mbit, all_tasks=True)), workers))
    shares = equal_time_shares(times[0], times[1], per_worker)
    return {
        "batch_shares": format_shares(shares),
        "t_full_ms": [round(1e3 * t, 3) for t in times[0]],
        "t_half_ms": [round(1e3 * t, 3) for t in times[1]],
        "per_worker_batch": per_worker,
        "steps": steps,
    }


def _define(fv: Any) -> None:
    from absl import flags

    d = dict(flag_values=fv)
    flags.DEFINE_string("model", "cnn", "the runner's --model", **d)
    flags.DEFINE_integer("batch_size", 512, "the global batch of the training run (equal shares)", **d)
    flags.DEFINE_integer("workers", 4, "worker processes", **d)
    flags.DEFINE_string("slow_workers", "", "the runner's --slow_workers (emulated slower devices)", **d)
    flags.DEFINE_float("bandwidth_mbit", 0.0, "shape the cluster's links to this rate (0: unshaped)", **d)
    flags.DEFINE_integer("steps", STEPS, "steps per calibration run", **d)


def _body(fv: Any) -> int:
    if fv.workers < 1:
        _cli.fail(f"--workers: must be >= 1, got {fv.workers}")
    if fv.batch_size // fv.workers < 2:
        _cli.fail(
            f"--batch_size: {fv.batch_size} gives fewer than 2 examples to each of {fv.workers} worker(s)"
        )
    if fv.steps < 16:
        _cli.fail(f"--steps: must be >= 16 (the first ten steps are not timed), got {fv.steps}")
    parse_slow_workers(fv.slow_workers, where="--slow_workers")
    out = calibrate_shares(
        fv.model, fv.batch_size, fv.workers, fv.slow_workers, fv.bandwidth_mbit or None, fv.steps
    )
    print(json.dumps(out))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m experiments.batch_shares`` in process; returns the exit code."""
    return _cli.main("experiments.batch_shares", argv, _define, _body)


if __name__ == "__main__":
    raise SystemExit(main())
