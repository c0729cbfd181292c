"""When two-level averaging syncs: (h, m) from measured intra-host, inter-host and step times (pure policy).

Thesis 001's rule (``AutoInterval``) applied to each level on its own link:

    H  = clip(round(t_inter / (target_ratio · t_comp)), 1, max_interval)   the global interval, as
                                                                           AutoInterval picks it for
                                                                           the slow link
    h₀ = clip(round(t_intra / (intra_ratio · t_comp)), 1, max_interval)   the same rule, fast link
    h  = min(h₀, H),   m = max(1, round(H / h)),   m·h ≤ max_interval

so the global interval is m·h, the multiple of h nearest H. Each level's communication is about its ratio
of the computation. The global level gets AutoInterval's ratio (the slow link decides the wall time);
the intra-host syncs buy accuracy (less drift between the host's replicas), not speed, so by default
they may cost a tenth of the computation (``intra_ratio=0.1``): with ratio 1 an intra-host sync a quarter
of a step's time would run after every step and add a quarter to the wall time. Degenerate cases: a free intra-host
sync gives h = 1 (average within the host every step); an intra-host sync as slow as the global one
gives m = 1 (one level, today's H); one host has no global level: (h, m) = (h₀, 1), plain H = h₀ from
the only link there is. ``t_inter`` is the wall time of a global sync (which includes its intra-host
part), ``t_intra`` of an intra-host-only sync, ``t_comp`` of one local step; every worker must use the
same agreed numbers (one all-reduce of the medians, as AutoInterval does).

Example:
    >>> policy = TwoLevelInterval()
    >>> policy.choose(t_intra_s=0.001, t_inter_s=0.5, t_comp_s=0.02)    # h0 = 1 (round(0.5)), H = 25
    (1, 25)
    >>> policy.choose(t_intra_s=0.01, t_inter_s=0.5, t_comp_s=0.02)     # h0 = 5, H = 25
    (5, 5)
    >>> policy.choose(0.01, 0.5, 0.02, hosts=1)                          # one host: plain H = 5
    (5, 1)
    >>> TwoLevelInterval(intra_ratio=0)
    Traceback (most recent call last):
    ...
    tf_commopt.errors.InputError: TwoLevelInterval(intra_ratio=...): must be a finite number > 0, got 0
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple

from tf_commopt.core.interval import first_iteration_interval, validate_max_interval, validate_target_ratio
from tf_commopt.errors import InputError

__all__ = ["TwoLevelInterval"]


def _seconds(value: object, where: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise InputError(f"must be a finite number of seconds >= 0, got {value!r}", where=where)
    return float(value)


@dataclass(frozen=True)
class TwoLevelInterval:
    """Choose the intra-host interval h and the multiple m (global interval H = m·h).

    Attributes:
        target_ratio: the aimed (global communication) / (computation), as ``AutoInterval``'s.
        intra_ratio: the same for the intra-host level.
        max_interval: cap on H = m·h (and so on h).
    """

    target_ratio: float = 1.0
    intra_ratio: float = 0.1
    max_interval: int = 256

    def __post_init__(self) -> None:
        name = "TwoLevelInterval({}=...)"
        object.__setattr__(
            self, "target_ratio", validate_target_ratio(self.target_ratio, name.format("target_ratio"))
        )
        object.__setattr__(
            self, "intra_ratio", validate_target_ratio(self.intra_ratio, name.format("intra_ratio"))
        )
        object.__setattr__(
            self, "max_interval", validate_max_interval(self.max_interval, name.format("max_interval"))
        )

    def intra_interval(self, t_intra_s: float, t_comp_s: float) -> int:
        """h₀ = clip(round(t_intra / (intra_ratio · t_comp)), 1, max_interval), before it is fitted to H.

        >>> TwoLevelInterval().intra_interval(0.03, 0.1)
        3
        """
        t_intra, t_comp = _seconds(t_intra_s, "t_intra_s"), _seconds(t_comp_s, "t_comp_s")
        return first_iteration_interval(t_intra, t_comp, self.intra_ratio, self.max_interval)

    def choose(self, t_intra_s: float, t_inter_s: float, t_comp_s: float, hosts: int = 2) -> Tuple[int, int]:
        """(h, m) from the agreed seconds of an intra-host sync, a global sync and a local step.

        >>> TwoLevelInterval(max_interval=16).choose(0.0, 10.0, 0.01)          # intra free: h = 1
        (1, 16)
        >>> TwoLevelInterval(intra_ratio=1.0).choose(0.5, 0.5, 0.02)            # no faster level: m = 1
        (25, 1)
        """
        t_intra = _seconds(t_intra_s, "t_intra_s")
        t_inter = _seconds(t_inter_s, "t_inter_s")
        t_comp = _seconds(t_comp_s, "t_comp_s")
        if isinstance(hosts, bool) or not isinstance(hosts, int) or hosts < 1:
            raise InputError(f"must be an integer >= 1, got {hosts!r}", where="hosts")
        h0 = self.intra_interval(t_intra, t_comp)
        if hosts == 1:
            return h0, 1
        big_h = first_iteration_interval(t_inter, t_comp, self.target_ratio, self.max_interval)
        h = min(h0, big_h)
        m = max(1, math.floor(big_h / h + 0.5))
        m = min(m, max(1, self.max_interval // h))
        return h, m
