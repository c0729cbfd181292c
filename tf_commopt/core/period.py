"""How many local steps each worker takes between two syncs in a time-based period (pure policy).

Step-based skip-and-correct gives every worker H local steps, so at each sync the fast workers wait for
the slowest. A time-based period gives every worker the same wall budget instead: the budget is what H
steps cost the *fastest* worker, and worker i takes as many steps as fit in it,

    budget = H · min_j t_j            τ_i = clip(floor(budget / t_i'), min_steps, max_steps)

where t_i' = min_j t_j for a worker within ``tolerance`` of the fastest (t_i ≤ (1 + tolerance) · min_j t_j),
else t_i: measured times scatter, and workers that are equal up to that noise all take H steps (so the
sync is the step rule's) instead of counts that follow the noise.

from the measured per-step times t_i (every worker must use the same t_i: the workers agree on them
first, e.g. one all-reduce of the vector of medians). The fastest worker takes exactly H steps; a
worker k times slower about H/k. With ``interval="auto"``'s inputs (:meth:`TimePeriod.from_auto`) H is
the one ``AutoInterval`` would choose for the fastest worker's step time. Deterministic: the same times
give the same counts on every worker.

Example:
    >>> policy = TimePeriod(interval=8)
    >>> policy.steps([0.010, 0.020, 0.015, 0.010])
    (8, 4, 5, 8)
    >>> policy.steps([0.010, 0.0115, 0.0125])  # within 20% of the fastest: H; beyond: budget / t_i
    (8, 8, 6)
    >>> policy.budget_s([0.010, 0.020])
    0.08
    >>> TimePeriod(interval=8).steps([0.01, -1.0])
    Traceback (most recent call last):
    ...
    tf_commopt.errors.InputError: step_times[1]: must be a finite number of seconds > 0, got -1.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from tf_commopt.core.interval import first_iteration_interval, validate_max_interval
from tf_commopt.core.unequal import validate_tau_eff
from tf_commopt.errors import InputError

__all__ = ["TimePeriod", "TimeBudget", "resolve_period", "validate_step_times"]

_EPS = 1e-9  # 0.08 / 0.02 is 3.9999999999999996: a count that fits exactly is not lost to rounding


def validate_step_times(step_times: Sequence[object], where: str = "step_times") -> Tuple[float, ...]:
    """Per-worker seconds per local step: a non-empty sequence of finite numbers > 0.

    >>> validate_step_times([0.01, 0.02])
    (0.01, 0.02)
    """
    if isinstance(step_times, (str, bytes)) or not hasattr(step_times, "__len__") or len(step_times) == 0:
        raise InputError(f"must be a non-empty list of seconds per step, got {step_times!r}", where=where)
    out = []
    for i, t in enumerate(step_times):
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise InputError(f"must be a finite number of seconds > 0, got {t!r}", where=f"{where}[{i}]")
        out.append(float(t))
    return tuple(out)


def _tolerance(value: object, where: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise InputError(f"must be a finite fraction >= 0, got {value!r}", where=where)
    return float(value)


def _positive_int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"must be an integer >= 1, got {value!r}", where=where)
    return value


@dataclass(frozen=True)
class TimePeriod:
    """The time-based period: every worker steps for the fastest worker's H-step time.

    Attributes:
        interval: H, the fastest worker's steps per period.
        min_steps: the fewest local steps any worker takes (a very slow worker still contributes).
        max_steps: the most (None: no cap; the fastest takes H, so only ``budget`` can exceed it).
        budget: a fixed wall budget in seconds instead of H · min_j t_j (None: from H).
        tolerance: a worker whose step time is within this fraction of the fastest's counts as the
            fastest (0: every difference counts).
    """

    interval: int = 4
    min_steps: int = 1
    max_steps: Optional[int] = None
    budget: Optional[float] = None
    tolerance: float = 0.2

    def __post_init__(self) -> None:
        _positive_int(self.interval, "TimePeriod(interval=...)")
        _positive_int(self.min_steps, "TimePeriod(min_steps=...)")
        if self.max_steps is not None:
            _positive_int(self.max_steps, "TimePeriod(max_steps=...)")
            if self.max_steps < self.min_steps:
                raise InputError(
                    f"must be >= min_steps ({self.min_steps}), got {self.max_steps}",
                    where="TimePeriod(max_steps=...)",
                )
        _tolerance(self.tolerance, "TimePeriod(tolerance=...)")
        if self.budget is not None:
            b = self.budget
            if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or b <= 0:
                raise InputError(
                    f"must be a finite number of seconds > 0, got {b!r}", where="TimePeriod(budget=...)"
                )

    @classmethod
    def from_auto(
        cls,
        t_comm_s: float,
        step_times: Sequence[float],
        target_ratio: float = 1.0,
        max_interval: int = 256,
        min_steps: int = 1,
        tolerance: float = 0.2,
    ) -> "TimePeriod":
        """The period ``interval="auto"``'s inputs give: H = clip(round(t_comm / (target_ratio · t_fast)),
        1, max_interval), t_fast the fastest worker's step time.

        >>> TimePeriod.from_auto(0.54, [0.05, 0.1]).interval
        11
        """
        times = validate_step_times(step_times)
        h = first_iteration_interval(t_comm_s, min(times), target_ratio, max_interval)
        return cls(
            interval=h,
            min_steps=min_steps,
            max_steps=validate_max_interval(max_interval),
            tolerance=tolerance,
        )

    def budget_s(self, step_times: Sequence[float]) -> float:
        """The wall budget of one period: ``budget`` if set, else H · min_j t_j."""
        times = validate_step_times(step_times)
        return float(self.budget) if self.budget is not None else self.interval * min(times)

    def steps(self, step_times: Sequence[float]) -> Tuple[int, ...]:
        """τ_i = clip(floor(budget / t_i'), min_steps, max_steps) for each worker's step time t_i (t_i' the
        fastest's time for a worker within ``tolerance`` of it, else t_i)."""
        times = validate_step_times(step_times)
        budget = self.budget_s(times)
        cap = self.max_steps if self.max_steps is not None else math.inf
        fastest = min(times)
        out = []
        for t in times:
            if t <= fastest * (1.0 + self.tolerance):
                t = fastest
            fit = math.floor(budget / t * (1.0 + _EPS))
            out.append(int(min(cap, max(self.min_steps, fit))))
        return tuple(out)


@dataclass(frozen=True)
class TimeBudget:
    """The options of ``SkipCorrectStrategy(period="time")`` (``period="time"`` is ``TimeBudget()``).

    Every period, worker i takes τ_i = :meth:`TimePeriod.steps` local steps (the fastest H, a worker k
    times slower about H/k) from a table of per-replica seconds per step that every worker holds.

    Attributes:
        min_steps: the fewest local steps a replica takes per period (1..H).
        step_times: fixed seconds per step, one per replica of the cluster (global replica order): the
            counts are then fixed and nothing is measured (tests, known hardware). None: measured — the
            first period is H steps everywhere; at every sync each worker's mean seconds per local step
            of that period travel in one small all-reduce and set the next period's counts.
        tolerance: a replica whose step time is within this fraction of the fastest's takes H steps, as
            the fastest does (measured times scatter; 0: every difference counts).
        tau_eff: how far the sync moves along the normalised average direction (``core/unequal.py``):
            ``"mean"`` (FedNova's Σ_i p_i τ_i) or ``"max"`` (the fastest replica's τ, H). Equal counts
            make both the step rule.

    >>> TimeBudget(step_times=(0.01, 0.02)).counts(4)
    (4, 2)
    >>> TimeBudget(min_steps=0)
    Traceback (most recent call last):
    ...
    tf_commopt.errors.InputError: TimeBudget(min_steps=...): must be an integer >= 1, got 0
    """

    min_steps: int = 1
    step_times: Optional[Tuple[float, ...]] = None
    tolerance: float = 0.2
    tau_eff: str = "mean"

    def __post_init__(self) -> None:
        _positive_int(self.min_steps, "TimeBudget(min_steps=...)")
        _tolerance(self.tolerance, "TimeBudget(tolerance=...)")
        validate_tau_eff(self.tau_eff, "TimeBudget(tau_eff=...)")
        if self.step_times is not None:
            object.__setattr__(
                self, "step_times", validate_step_times(self.step_times, where="TimeBudget(step_times=...)")
            )

    def policy(self, interval: int) -> TimePeriod:
        """The :class:`TimePeriod` for H = ``interval`` (no replica takes more than H steps)."""
        return TimePeriod(
            interval=interval,
            min_steps=min(self.min_steps, interval),
            max_steps=interval,
            tolerance=self.tolerance,
        )

    def counts(self, interval: int, step_times: Optional[Sequence[float]] = None) -> Tuple[int, ...]:
        """τ_i for every replica from ``step_times`` (default: the fixed ``step_times``)."""
        times = self.step_times if step_times is None else step_times
        if times is None:
            raise InputError("no step times: give step_times or measure them", where="TimeBudget.counts")
        return self.policy(interval).steps(times)


def resolve_period(period: object, where: str = "period") -> Optional[TimeBudget]:
    """``"steps"`` -> None (every replica takes H steps), ``"time"`` -> ``TimeBudget()``, a ``TimeBudget``
    as given; anything else is a one-line InputError.

    >>> resolve_period("steps") is None, resolve_period("time")
    (True, TimeBudget(min_steps=1, step_times=None, tolerance=0.2, tau_eff='mean'))
    """
    if isinstance(period, TimeBudget):
        return period
    if period == "steps":
        return None
    if period == "time":
        return TimeBudget()
    raise InputError(f"must be 'steps', 'time' or a TimeBudget, got {period!r}", where=where)
