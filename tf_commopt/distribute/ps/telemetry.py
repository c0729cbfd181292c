"""What a round reports and what ``stats()`` sums: SkipCorrectStrategy's keys for the parameter-server path.

* ``compute_s``: per round, the slowest closure's local-step time, measured on the worker with
  ``tf.timestamp()`` between its pulls and its pushes;
* ``comm_s``: the rest of the round's wall time on the chief (pulls, pushes, scheduling, the averaging on
  the ps);
* ``bytes``: the worker<->ps payload of the round (``plan.RoundPlan.bytes_per_round``).

Example:
    >>> outs = [(0, 0.5, [2.0, 0.25]), (1, 0.75, [4.0, 0.75])]   # (worker, compute s, [loss, metric])
    >>> rec = round_record(0, outs, ["mae"], steps=4, interval=4, bytes_=100, wait_s=1.0, apply_s=0.125)
    >>> rec["loss"], rec["metrics"], rec["workers"], rec["compute_s"], rec["comm_s"]
    (3.0, {'mae': 0.5}, [0, 1], 0.75, 0.375)
    >>> summary([rec], interval=4, steps=4, syncs=1)["bytes_communicated"]
    100
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

import numpy as np

__all__ = ["round_record", "summary"]


def round_record(
    index: int,
    outs: Sequence[Any],
    metric_names: Sequence[str],
    steps: int,
    interval: int,
    bytes_: int,
    wait_s: float,
    apply_s: float,
) -> Dict[str, Any]:
    """The record of round ``index`` from its closures' outputs ``(worker, compute_s, [loss, metrics...])``.

    Args:
        index: the round's number.
        outs: one output per shard, in shard order.
        metric_names: the names of the metric values after the loss.
        steps: the round's local steps; interval: H.
        bytes_: the round's worker<->ps payload.
        wait_s: from scheduling the closures to their results; apply_s: the averaging on the ps.
    """
    compute = max(float(o[1]) for o in outs)
    means = np.mean([np.asarray(o[2]) for o in outs], axis=0)  # [loss, metrics...], mean over the shards
    return {
        "round": index,
        "loss": float(means[0]),
        "metrics": {n: float(v) for n, v in zip(metric_names, means[1:])},
        "workers": [int(o[0]) for o in outs],
        "compute_s": compute,
        "comm_s": max(0.0, wait_s - compute) + apply_s,
        "bytes": bytes_,
        "interval": interval,
        "steps": steps,
    }


def summary(history: List[Dict[str, Any]], interval: int, steps: int, syncs: int) -> Dict[str, Any]:
    """``interval, steps, syncs, comm_s, compute_s, bytes_communicated`` over the rounds of ``history``,
    ``first_round_s`` (the first round's wall time: it also ships the round function, with any data
    constants, to the workers) and ``median_round_s`` (the median of the later rounds)."""
    walls = [r["compute_s"] + r["comm_s"] for r in history]
    return {
        "interval": interval,
        "steps": steps,
        "syncs": syncs,
        "comm_s": sum(r["comm_s"] for r in history),
        "compute_s": sum(r["compute_s"] for r in history),
        "bytes_communicated": sum(r["bytes"] for r in history),
        "first_round_s": walls[0] if walls else None,
        "median_round_s": float(np.median(walls[1:])) if len(walls) > 1 else None,
    }
