"""Which kind of round runs, from the interval, the optimizer and the correction (the policy; the closure
and the averaging step are the mechanism).

Three kinds (K shards, H local steps):

* **local** (H > 1, or any optimizer with a correction): each closure runs H steps of the optimizer on its
  copy x_i and pushes s_i = x_i - x and its slots; the ps averages. Worker<->ps bytes per shard and round:
  pull x, push s_i, pull D_i [vrl, gradient], push G_i [gradient], pull and push each optimizer slot.
* **ps finishes** (H = 1, plain SGD or momentum with a constant lr, ``none`` or ``vrl``): the closure
  pushes its gradient g_i and the ps runs the SGD step per shard and averages (the same numbers, 2 model
  sizes per shard).
* **synchronous** (H = 1, ``none``, any other optimizer or a schedule): the closure pushes g_i and the ps
  applies the optimizer once to the mean gradient, its slots kept identical in every shard's row.

Example:
    >>> plan = RoundPlan(interval=1, correction="none", ps_finish=True, num_slots=1)
    >>> plan.local, plan.synchronous, plan.bytes_per_round(num_shards=2, param_bytes=100)
    (False, False, 400)
    >>> RoundPlan(4, "vrl", True, 1).bytes_per_round(2, 100)   # pull x, push s_i, pull D_i, slot pull + push
    1000
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["RoundPlan", "ps_can_finish"]


def ps_can_finish(rule: Any, correction: str) -> bool:
    """Whether the ps can finish a one-step round from the pushed gradients: plain SGD or heavy-ball
    momentum with a constant lr, and correction ``none`` or ``vrl`` (the step is linear in g_i).

    Example:
        >>> from tf_commopt.distribute.ps.rules import sgd_rule      # doctest: +SKIP
        >>> ps_can_finish(sgd_rule(0.1, momentum=0.9), "vrl")          # doctest: +SKIP
        True
    """
    return (
        rule.name == "SGD" and not rule.nesterov and rule.schedule is None and correction in ("none", "vrl")
    )


@dataclass(frozen=True)
class RoundPlan:
    """How rounds of ``interval`` local steps run (see the module docstring).

    Args:
        interval: H.
        correction: ``"vrl"``, ``"gradient"`` or ``"none"`` (resolved).
        ps_finish: :func:`ps_can_finish` for the optimizer and correction.
        num_slots: the optimizer's slots per variable (SGD with momentum 1, Adam 2, ...).
    """

    interval: int
    correction: str
    ps_finish: bool
    num_slots: int

    @property
    def synchronous(self) -> bool:
        """H = 1 and no correction, for an optimizer the ps cannot finish per shard: the ps applies it once
        to the mean gradient."""
        return self.interval == 1 and not self.ps_finish and self.correction == "none"

    @property
    def local(self) -> bool:
        """Closures run local steps and push s_i (else they push g_i and the ps finishes the step)."""
        return not (self.interval == 1 and self.ps_finish) and not self.synchronous

    def bytes_per_round(self, num_shards: int, param_bytes: int) -> int:
        """Worker<->ps payload of one round (gRPC framing not counted)."""
        if not self.local:
            return num_shards * 2 * param_bytes
        corr = int(self.correction in ("vrl", "gradient")) + int(self.correction == "gradient")
        return num_shards * (2 + corr + 2 * self.num_slots) * param_bytes
