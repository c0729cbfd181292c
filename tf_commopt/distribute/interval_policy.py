"""When a SkipCorrectStrategy averages: a fixed H, or :class:`AutoInterval`, the measured choice of H.

The policy is a value (a frozen dataclass, validated when built); the strategy's
:class:`~tf_commopt.distribute.interval_state.IntervalState` runs it inside the training step.
``interval="auto"`` means ``AutoInterval()``. Importing this module does not import TensorFlow.

``AutoInterval`` goes through three phases, counted in the strategy's steps t = 1, 2, ...:

1. **warm-up** (t ≤ ``warmup_steps``): H = 1; tracing and collective set-up happen here and are not
   measured;
2. **probe**: H = ``probe_interval`` until ``measure_syncs`` scheduled syncs are done. Every step's
   local computation time is a t_comp sample and every sync's wall time a t_comm sample;
3. **chosen**: at the last probe sync every worker takes the medians of its own samples, the workers
   average the two medians (one MEAN all-reduce of two floats) and every worker sets, and keeps,
   H = :meth:`AutoInterval.choose` (t̃_comm, t̃_comp).

Example:
    >>> from tf_commopt.distribute.interval_policy import AutoInterval
    >>> policy = AutoInterval(target_ratio=0.5, max_interval=64)
    >>> policy.choose(t_comm_s=0.54, t_comp_s=0.05)        # round(0.54 / (0.5 * 0.05))
    22
    >>> policy.choose(t_comm_s=0.54, t_comp_s=0.05, overlap=True)   # ceil: communication hidden
    22
    >>> AutoInterval(probe_interval=0)
    Traceback (most recent call last):
    ...
    tf_commopt.errors.InputError: AutoInterval(probe_interval=...): must be an integer >= 1, got 0
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Union

from tf_commopt.core.interval import (
    first_iteration_interval,
    overlap_interval,
    validate_interval,
    validate_max_interval,
    validate_target_ratio,
)
from tf_commopt.errors import InputError

__all__ = ["AutoInterval", "resolve_interval", "SHORTHAND"]


def _positive_int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"must be an integer >= 1, got {value!r}", where=where)
    return value


_CHECKS = {
    "target_ratio": lambda v, where: float(validate_target_ratio(v, where=where)),
    "max_interval": lambda v, where: validate_max_interval(v, where=where),
    "warmup_steps": _positive_int,
    "probe_interval": _positive_int,
    "measure_syncs": _positive_int,
}


@dataclass(frozen=True)
class AutoInterval:
    """Choose H from the first steps' timings (module docstring), then keep it.

    Args:
        target_ratio: the aimed (communication time) / (computation time) per epoch (> 0).
        max_interval: cap on the chosen H (≥ 1).
        warmup_steps: steps at H = 1 before measuring (≥ 1).
        probe_interval: H while measuring (≥ 1).
        measure_syncs: timed syncs before H is chosen (≥ 1).

    Example:
        >>> AutoInterval().probe_interval, AutoInterval(max_interval=8).choose(1.0, 0.001)
        (16, 8)
    """

    target_ratio: float = 1.0
    max_interval: int = 256
    warmup_steps: int = 2
    probe_interval: int = 16
    measure_syncs: int = 3

    def __post_init__(self) -> None:
        for name, check in _CHECKS.items():
            object.__setattr__(self, name, check(getattr(self, name), f"AutoInterval({name}=...)"))

    def choose(self, t_comm_s: float, t_comp_s: float, overlap: bool = False) -> int:
        """H from the agreed per-sync communication and per-step computation seconds.

        Blocking syncs: H = clip(round(t_comm / (target_ratio · t_comp)), 1, max_interval), so that
        communication is ``target_ratio`` of computation; with ``overlap=True``: H = clip(ceil(...), 1,
        max_interval), so that one sync's communication hides behind H steps
        (:func:`tf_commopt.core.interval.first_iteration_interval`, :func:`~tf_commopt.core.interval.overlap_interval`).

        >>> AutoInterval().choose(0.1, 0.03), AutoInterval().choose(0.1, 0.03, overlap=True)
        (3, 4)
        """
        rule = overlap_interval if overlap else first_iteration_interval
        return int(rule(float(t_comm_s), float(t_comp_s), self.target_ratio, self.max_interval))


SHORTHAND = {
    "target_ratio": "target_ratio",
    "max_interval": "max_interval",
    "auto_warmup_steps": "warmup_steps",
    "auto_probe_interval": "probe_interval",
    "auto_measure_syncs": "measure_syncs",
}
"""The strategy's shorthand keywords for ``interval="auto"`` -> the :class:`AutoInterval` field each sets."""


def resolve_interval(
    interval: Union[int, str, AutoInterval],
    shorthand: Optional[Dict[str, Any]] = None,
    owner: str = "SkipCorrectStrategy",
) -> Union[int, AutoInterval]:
    """The interval policy: a fixed H (int ≥ 1) or an :class:`AutoInterval`.

    Args:
        interval: an int ≥ 1 (also as a string), ``"auto"`` (``AutoInterval()``) or an ``AutoInterval``.
        shorthand: the shorthand keywords that were given (:data:`SHORTHAND`; None values are "not
            given"); with ``"auto"`` they build the ``AutoInterval``, with a fixed H they are unused.
        owner: names the caller in a one-line InputError (``owner(keyword=...): what was wrong``).

    Returns:
        ``int`` H or an ``AutoInterval``.

    Raises:
        InputError: a bad interval or value, or shorthand keywords next to an ``AutoInterval``.

    Example:
        >>> resolve_interval("auto", {"max_interval": 8})
        AutoInterval(target_ratio=1.0, max_interval=8, warmup_steps=2, probe_interval=16, measure_syncs=3)
        >>> resolve_interval(4)
        4
    """
    given = {k: v for k, v in (shorthand or {}).items() if v is not None}
    fields = {}
    for key, value in given.items():
        if key not in SHORTHAND:
            raise InputError(f"unknown keyword {key!r}", where=owner)
        fields[SHORTHAND[key]] = _CHECKS[SHORTHAND[key]](value, f"{owner}({key}=...)")
    if isinstance(interval, AutoInterval):
        if given:
            raise InputError(
                f"give {', '.join(sorted(given))} inside AutoInterval(...), not next to it",
                where=f"{owner}(interval=...)",
            )
        return interval
    interval = validate_interval(interval, where=f"{owner}(interval=...)")
    return AutoInterval(**fields) if interval == "auto" else int(interval)
