"""Communication-interval policies: how many local steps H between two global averagings.

Three policies, all pure Python so they are unit-tested with injected timings:

* :class:`FirstIterationPolicy` — thesis 001's rule. Start with H = 1, measure the time of one
  model all-reduce (``t_comm``) and of one local step (``t_comp``) once, after a few warm-up steps
  (so tracing and collective set-up are not measured), then fix

      H = clip(round(t_comm / (target_ratio * t_comp)), 1, max_interval)

  In an epoch of S steps, computation costs S * t_comp and communication (S / H) * t_comm; the rule
  makes them equal when ``target_ratio`` = 1 (the ratio comm/comp it aims for). Every worker must use
  the same H: :func:`agree_on_timings` averages the workers' measurements first (one tiny
  all-reduce of two floats), so every worker computes the same H from the same numbers.
* :class:`AdaCommPolicy` — the AdaComm-style rule (Wang & Joshi, "Adaptive Communication Strategies to
  Achieve the Best Error-Runtime Trade-off in Local-Update SGD", SysML 2019), as in PaddlePaddle's
  ``AdaptiveLocalSGDOptimizer``: at every sync the workers all-reduce their loss (an extra collective
  per sync) and set

      H_next = clip(ceil(sqrt(lr_0 * loss / (lr * loss_0) * H_0)), 1, max_interval)

  where ``loss_0`` is the loss at the first sync and ``lr_0`` the learning rate then.
* :class:`GridSearchPolicy` — short trial runs for each H in {1, 2, 4, ..., 64}; the H with the largest
  loss decrease per wall second wins. Its overhead is the trials' total wall time.

Each policy reports ``overhead_s``: the extra wall seconds it spent choosing H (measured by the caller
and fed in, so the core stays clock-free and deterministic).

Example:
    >>> from tf_commopt.core.interval import FirstIterationPolicy
    >>> p = FirstIterationPolicy(target_ratio=1.0, max_interval=64)
    >>> p.choose(t_comm_s=0.54, t_comp_s=0.05)
    11
    >>> p.interval
    11
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from tf_commopt.errors import InputError

__all__ = [
    "validate_interval",
    "validate_target_ratio",
    "validate_max_interval",
    "first_iteration_interval",
    "overlap_interval",
    "agree_on_timings",
    "FirstIterationPolicy",
    "AdaCommPolicy",
    "GridSearchPolicy",
    "TrialResult",
]


def validate_interval(interval: object, where: str = "interval") -> object:
    """Return ``interval`` if it is a positive int or ``"auto"``; raise a one-line InputError otherwise.

    >>> validate_interval(4), validate_interval("auto")
    (4, 'auto')
    """
    if isinstance(interval, str):
        if interval == "auto":
            return interval
        try:
            interval = int(interval)
        except ValueError:
            raise InputError(f"must be a positive integer or 'auto', got {interval!r}", where=where) from None
    if isinstance(interval, bool) or not isinstance(interval, int):
        raise InputError(f"must be a positive integer or 'auto', got {interval!r}", where=where)
    if interval < 1:
        raise InputError(f"must be >= 1, got {interval}", where=where)
    return interval


def validate_target_ratio(target_ratio: object, where: str = "target_ratio") -> float:
    """The aimed comm/comp ratio of ``interval="auto"``: a finite number > 0 (the one check of it).

    >>> validate_target_ratio(0.5)
    0.5
    """
    if (
        isinstance(target_ratio, bool)
        or not isinstance(target_ratio, (int, float))
        or not math.isfinite(target_ratio)
        or target_ratio <= 0
    ):
        raise InputError(f"must be a finite number > 0, got {target_ratio!r}", where=where)
    return float(target_ratio)


def validate_max_interval(max_interval: object, where: str = "max_interval") -> int:
    """The cap on H chosen by ``interval="auto"``: an integer >= 1 (the one check of it).

    >>> validate_max_interval(256)
    256
    """
    if isinstance(max_interval, bool) or not isinstance(max_interval, int) or max_interval < 1:
        raise InputError(f"must be an integer >= 1, got {max_interval!r}", where=where)
    return max_interval


def _positive_time(x: float, what: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
        raise InputError(f"{what} must be a finite non-negative number of seconds, got {x!r}")
    return float(x)


def first_iteration_interval(
    t_comm_s: float, t_comp_s: float, target_ratio: float = 1.0, max_interval: int = 256
) -> int:
    """Thesis 001's rule: ``clip(round(t_comm / (target_ratio * t_comp)), 1, max_interval)``.

    >>> first_iteration_interval(1.0, 0.1), first_iteration_interval(0.01, 0.1)
    (10, 1)
    >>> first_iteration_interval(10.0, 0.001, max_interval=64)
    64
    """
    return _ratio_interval(
        t_comm_s, t_comp_s, target_ratio, max_interval, lambda q: math.floor(q + 0.5)
    )  # round half up, platform-independent


def overlap_interval(
    t_comm_s: float, t_comp_s: float, target_ratio: float = 1.0, max_interval: int = 256
) -> int:
    """Thesis 001's rule for overlapped syncs (``SkipCorrectStrategy(overlap=True)``): the background
    all-reduce must fit behind the next H local steps, t_comm ≤ target_ratio·H·t_comp, so
    ``clip(ceil(t_comm / (target_ratio * t_comp)), 1, max_interval)`` — the smallest H that hides it
    (the blocking rule rounds to equality instead).

    >>> overlap_interval(1.0, 0.1), overlap_interval(1.01, 0.1), overlap_interval(0.01, 0.1)
    (10, 11, 1)
    >>> overlap_interval(10.0, 0.001, max_interval=64)
    64
    """
    return _ratio_interval(
        t_comm_s, t_comp_s, target_ratio, max_interval, lambda q: math.ceil(q - 1e-9)
    )  # 1e-9: 1.0/0.1 is 10.000000000000002


def _ratio_interval(
    t_comm_s: float, t_comp_s: float, target_ratio: float, max_interval: int, to_int: Callable[[float], float]
) -> int:
    """clip(to_int(t_comm / (target_ratio * t_comp)), 1, max_interval) with the arguments validated; the cap
    when t_comp is 0 and t_comm is not, 1 when both are."""
    t_comm = _positive_time(t_comm_s, "t_comm_s")
    t_comp = _positive_time(t_comp_s, "t_comp_s")
    target_ratio = validate_target_ratio(target_ratio)
    max_interval = validate_max_interval(max_interval)
    if t_comp == 0:
        return max_interval if t_comm > 0 else 1
    return max(1, min(max_interval, int(to_int(t_comm / (target_ratio * t_comp)))))


def agree_on_timings(per_worker: Sequence[Tuple[float, float]]) -> Tuple[float, float]:
    """Mean (t_comm, t_comp) over workers: what an all-reduce of the two numbers gives every worker.

    >>> agree_on_timings([(1.0, 0.1), (3.0, 0.3)])
    (2.0, 0.2)
    """
    if not per_worker:
        raise InputError("no timings to agree on")
    n = len(per_worker)
    return (sum(float(c) for c, _ in per_worker) / n, sum(float(p) for _, p in per_worker) / n)


@dataclass
class FirstIterationPolicy:
    """Choose H once from one measured all-reduce and one measured local step (thesis 001).

    Attributes:
        target_ratio: desired (communication time) / (computation time) per epoch; 1.0 balances them.
        max_interval: cap on H.
        warmup_steps: steps run with H = 1 before measuring (tracing, collective set-up).
        interval: the chosen H (1 until :meth:`choose` runs).
        overhead_s: extra seconds spent choosing (the timed all-reduce and step, fed by the caller).
    """

    target_ratio: float = 1.0
    max_interval: int = 256
    warmup_steps: int = 2
    interval: int = 1
    chosen: bool = False
    t_comm_s: Optional[float] = None
    t_comp_s: Optional[float] = None
    overhead_s: float = 0.0

    def __post_init__(self) -> None:  # bad arguments fail at construction, not at the first choice
        self.target_ratio = validate_target_ratio(self.target_ratio, "FirstIterationPolicy(target_ratio=...)")
        self.max_interval = validate_max_interval(self.max_interval, "FirstIterationPolicy(max_interval=...)")

    def choose(self, t_comm_s: float, t_comp_s: float, overhead_s: float = 0.0) -> int:
        """Fix H from the (already agreed) timings; later calls return the same H."""
        if self.chosen:
            return self.interval
        self.interval = first_iteration_interval(t_comm_s, t_comp_s, self.target_ratio, self.max_interval)
        self.t_comm_s, self.t_comp_s = float(t_comm_s), float(t_comp_s)
        self.overhead_s += _positive_time(overhead_s, "overhead_s")
        self.chosen = True
        return self.interval


@dataclass
class AdaCommPolicy:
    """AdaComm-style interval from the training loss at each sync (Paddle's AdaptiveLocalSGD rule).

    >>> p = AdaCommPolicy(initial_interval=4)
    >>> p.on_sync(loss=2.0, lr=0.1)   # first sync records loss_0, lr_0
    4
    >>> p.on_sync(loss=0.5, lr=0.1)   # ceil(sqrt(0.1*0.5/(0.1*2.0)*4)) = ceil(1.0)
    1
    """

    initial_interval: int = 4
    max_interval: int = 16
    min_interval: int = 1
    interval: int = 0
    loss_0: Optional[float] = None
    lr_0: Optional[float] = None
    overhead_s: float = 0.0
    history: List[int] = field(default_factory=list)

    def __post_init__(self):
        validate_interval(self.initial_interval, "initial_interval")
        if self.interval == 0:
            self.interval = self.initial_interval

    def on_sync(self, loss: float, lr: float, overhead_s: float = 0.0) -> int:
        """Update H from the loss averaged over workers at this sync; returns the next H."""
        if not (math.isfinite(loss) and loss >= 0):
            raise InputError(f"loss must be finite and non-negative, got {loss!r}")
        if not (math.isfinite(lr) and lr > 0):
            raise InputError(f"learning rate must be positive, got {lr!r}")
        self.overhead_s += _positive_time(overhead_s, "overhead_s")
        if self.loss_0 is None:
            self.loss_0, self.lr_0 = float(loss), float(lr)
            self.interval = self.initial_interval
        elif self.loss_0 == 0:
            self.interval = self.min_interval
        else:
            x = self.lr_0 * loss / (lr * self.loss_0) * self.initial_interval
            self.interval = max(
                self.min_interval, min(self.max_interval, int(math.ceil(math.sqrt(x) - 1e-12)))
            )
        self.history.append(self.interval)
        return self.interval


@dataclass(frozen=True)
class TrialResult:
    """One trial run of the grid search: the loss before and after, and its wall seconds."""

    interval: int
    loss_before: float
    loss_after: float
    wall_s: float

    @property
    def rate(self) -> float:
        """Loss decrease per wall second (higher is better)."""
        return (self.loss_before - self.loss_after) / self.wall_s if self.wall_s > 0 else -math.inf


@dataclass
class GridSearchPolicy:
    """Pick H by short trial runs over ``candidates``; ``overhead_s`` is the trials' total wall time.

    >>> g = GridSearchPolicy(candidates=(1, 2, 4))
    >>> h = g.run(lambda h: TrialResult(h, 2.0, 2.0 - 0.1 * h, 1.0 + 0.05 * h))
    >>> h, round(g.overhead_s, 2)
    (4, 3.35)
    """

    candidates: Sequence[int] = (1, 2, 4, 8, 16, 32, 64)
    interval: int = 0
    overhead_s: float = 0.0
    trials: Dict[int, TrialResult] = field(default_factory=dict)

    def run(self, trial: Callable[[int], TrialResult]) -> int:
        """Call ``trial(h)`` for every candidate, keep the best loss-decrease rate; returns H."""
        if not self.candidates:
            raise InputError("grid search needs at least one candidate interval")
        for h in self.candidates:
            validate_interval(h, "candidate interval")
            r = trial(h)
            self.trials[h] = r
            self.overhead_s += _positive_time(r.wall_s, "trial wall_s")
        self.interval = max(self.candidates, key=lambda h: (self.trials[h].rate, -h))
        return self.interval
