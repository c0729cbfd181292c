"""``interval="auto"`` on the parameter-server path: when H is chosen and to what (the policy).

The first ``probe_rounds`` rounds run with H = 1. After them, H = clip(round(t_comm / (target_ratio x
t_comp)), 1, max_interval) (``tf_commopt.core.interval.FirstIterationPolicy``, SkipCorrectStrategy's
rule), from the median communication time per round (the round's wall time minus the slowest closure's
compute) and the median local-step time of the probe rounds after the first (which also ships the round
function to the workers). H is then fixed for the rest of the run; the trainer re-traces its round
functions once for it.

Example:
    >>> probe = IntervalProbe(target_ratio=1.0, max_interval=64, probe_rounds=3)
    >>> history = [{"comm_s": 1.0, "compute_s": 0.1}, {"comm_s": 0.08, "compute_s": 0.01},
    ...            {"comm_s": 0.12, "compute_s": 0.01}]
    >>> probe.due(len(history)), probe.choose(history)
    (True, 10)
    >>> probe.due(len(history)), probe.stats()["interval_t_comm_s"]
    (False, 0.1)
"""

from __future__ import annotations

from typing import Any, Dict, Sequence

import numpy as np

from tf_commopt.core.interval import FirstIterationPolicy
from tf_commopt.errors import InputError

__all__ = ["IntervalProbe"]


class IntervalProbe:
    """When and how ``interval="auto"`` fixes H (see the module docstring).

    Args:
        target_ratio: the communication / computation time ratio aimed at (1.0 balances them).
        max_interval: the largest H.
        probe_rounds: rounds at H = 1 before H is chosen (an integer >= 2: the first one is left out).
    """

    def __init__(self, target_ratio: float = 1.0, max_interval: int = 256, probe_rounds: int = 3) -> None:
        if isinstance(probe_rounds, bool) or not isinstance(probe_rounds, int) or probe_rounds < 2:
            raise InputError(f"must be an integer >= 2, got {probe_rounds!r}", where="probe_rounds")
        self.policy = FirstIterationPolicy(
            target_ratio=target_ratio, max_interval=max_interval, warmup_steps=1
        )
        self.probe_rounds = probe_rounds

    @property
    def chosen(self) -> bool:
        """Whether H is fixed (chosen, or restored from a checkpoint)."""
        return self.policy.chosen

    def due(self, rounds_done: int) -> bool:
        """Whether H should be chosen now, after ``rounds_done`` rounds."""
        return not self.policy.chosen and rounds_done >= self.probe_rounds

    def choose(self, history: Sequence[Dict[str, Any]]) -> int:
        """H from the probe rounds' records (``comm_s``, ``compute_s`` per local step at H = 1)."""
        probe = history[1 : self.probe_rounds]
        t_comm = float(np.median([r["comm_s"] for r in probe]))
        t_comp = float(np.median([r["compute_s"] for r in probe]))
        return self.policy.choose(t_comm, t_comp)

    def restore(self, interval: int) -> None:
        """Keep the H of a checkpoint taken after the probe."""
        self.policy.interval, self.policy.chosen = int(interval), True

    def stats(self) -> Dict[str, Any]:
        """``interval_t_comm_s``, ``interval_t_comp_s`` (the medians H came from) and ``interval_overhead_s``."""
        return {
            "interval_t_comm_s": self.policy.t_comm_s,
            "interval_t_comp_s": self.policy.t_comp_s,
            "interval_overhead_s": self.policy.overhead_s,
        }
