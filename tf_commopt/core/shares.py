"""Batch shares from measured step times: every worker's step as long as the fastest's (pure policy).

Batch balancing keeps every worker at H local steps per period and gives a slower worker a smaller
batch, so that nobody waits at the sync. A step's time is not proportional to its batch (a step has a
fixed part: kernel launches, the optimizer's update, input), so shares of 1/k for a worker k times
slower leave it slower than the others. From each worker's step time at the full per-worker batch B and
at B/2, the rule fits the line t_i(b) = a_i + c_i·b through the two points and gives worker i the batch
that takes as long as the fastest worker's full batch,

    T = min_j t_j(B)        b_i = clip((T − a_i) / c_i, 1, B)        share_i = b_i / B

(b_i = B when c_i ≤ 0: a time that does not grow with the batch is noise, not a slower device).
The fastest worker keeps share 1. Deterministic: the same times give the same shares on every worker.

Example:
    >>> equal_time_shares(t_full=[0.10, 0.20], t_half=[0.06, 0.12], batch=128)
    (1.0, 0.375)
    >>> format_shares((1.0, 0.375, 1.0))
    '1,0.375,1'
    >>> equal_time_shares([0.1], [0.2, 0.1], 128)
    Traceback (most recent call last):
    ...
    tf_commopt.errors.InputError: t_half: 2 times for 1 worker(s) in t_full; give one per worker
"""

from __future__ import annotations

from typing import Sequence, Tuple

from tf_commopt.core.period import validate_step_times
from tf_commopt.errors import InputError

__all__ = ["equal_time_shares", "format_shares"]


def equal_time_shares(t_full: Sequence[float], t_half: Sequence[float], batch: int) -> Tuple[float, ...]:
    """Each worker's batch share (its batch over ``batch``) under which every step takes about as long as
    the fastest worker's at the full batch (the module docstring's rule).

    Args:
        t_full: seconds per step of each worker at ``batch`` examples.
        t_half: seconds per step of each worker at ``batch // 2`` examples.
        batch: the full per-worker batch B (≥ 2).

    Returns:
        One share per worker in (0, 1], rounded to 3 decimals; 1.0 for the fastest.

    >>> equal_time_shares([0.1, 0.1], [0.06, 0.06], 64)
    (1.0, 1.0)
    """
    half = validate_step_times(t_half, "t_half")
    full = validate_step_times(t_full, "t_full")
    if len(half) != len(full):
        raise InputError(
            f"{len(half)} times for {len(full)} worker(s) in t_full; give one per worker", where="t_half"
        )
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 2:
        raise InputError(f"must be an integer >= 2, got {batch!r}", where="batch")
    small = batch // 2
    target = min(full)
    shares = []
    for tf_, th in zip(full, half):
        slope = (tf_ - th) / (batch - small)
        b = float(batch) if slope <= 0 else (target - (tf_ - slope * batch)) / slope
        shares.append(round(min(float(batch), max(1.0, b)) / batch, 3))
    return tuple(shares)


def format_shares(shares: Sequence[float]) -> str:
    """The runner's ``--batch_shares`` text for ``shares`` (``%g`` each, comma-separated)."""
    return ",".join(f"{s:g}" for s in shares)
