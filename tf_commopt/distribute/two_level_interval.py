"""Both intervals of two-level averaging chosen at run time: ``SkipCorrectStrategy(interval="auto",
host_interval="auto")``.

The host interval h and the global interval H = m·h come from the first steps' timings, with the
phases of the strategy's :class:`~tf_commopt.distribute.interval_policy.AutoInterval` (counted in the
strategy's steps t = 1, 2, ...):

1. **warm-up** (t ≤ ``warmup_steps``): H = h = 1 (a global sync after every step);
2. **probe**: h = max(1, ``probe_interval`` // 2) and H = ``probe_interval`` (one host sync per period
   at the default 16: a probe that host-syncs every step would pay for it at every step) until
   ``measure_syncs`` global syncs are done: every
   step's local computation is a t_comp sample (the syncs are not in it), every host sync a t_intra
   sample (an intra-host-only sync), every global sync a t_inter sample (the whole global sync, its host
   part included);
3. **chosen**: at the last probe sync every worker takes the medians of its samples, the workers average
   the three medians (one MEAN all-reduce) and every worker sets, and keeps,
   (h, m) = :meth:`TwoLevelInterval.choose <tf_commopt.core.levels.TwoLevelInterval.choose>`
   (t̃_intra, t̃_inter, t̃_comp, hosts), H = m·h; the strategy then zeroes every Δ_i and β_c
   (``SkipCorrectState.restart_corrections``: they were estimated over one-step host periods).

h is a host variable read in the step (the host syncs' rhythm and their correction's 1/h), like H.
The rule is a :class:`~tf_commopt.core.levels.TwoLevelInterval`: ``host_interval="auto"`` is
``TwoLevelInterval(target_ratio, max_interval)`` with the ``AutoInterval``'s two options, and a
``TwoLevelInterval`` given as ``host_interval`` sets ``intra_ratio`` too (its ``target_ratio`` and
``max_interval`` must then equal the ``AutoInterval``'s). Checkpoints hold h and t_intra next to H.

Example:
    >>> strategy = SkipCorrectStrategy(interval="auto", host_interval="auto")   # doctest: +SKIP
    >>> model.fit(x, y)                                                          # doctest: +SKIP
    >>> s = strategy.stats(); s["host_interval"], s["interval"]                 # doctest: +SKIP
    (2, 8)
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Union

import numpy as np
import tensorflow as tf

from tf_commopt._compat import host_variable
from tf_commopt.core.levels import TwoLevelInterval
from tf_commopt.distribute.interval_policy import AutoInterval
from tf_commopt.distribute.interval_state import IntervalState, median
from tf_commopt.errors import InputError

__all__ = ["TwoLevelIntervalState", "resolve_host_interval", "make_interval_state"]

HostInterval = Union[None, int, TwoLevelInterval]


def resolve_host_interval(
    host_interval: Any,
    interval: Union[int, AutoInterval],
    where: str = "SkipCorrectStrategy(host_interval=...)",
) -> HostInterval:
    """The host interval of a strategy whose interval policy is ``interval``: None (one level), a fixed h
    (``interval`` an int multiple of it) or the :class:`TwoLevelInterval` rule (``"auto"`` or one given,
    ``interval`` an ``AutoInterval``). One-line InputError otherwise.

    >>> resolve_host_interval("auto", AutoInterval(max_interval=64))
    TwoLevelInterval(target_ratio=1.0, intra_ratio=0.1, max_interval=64)
    >>> resolve_host_interval(2, 8)
    2
    """
    if host_interval is None:
        return None
    if isinstance(host_interval, TwoLevelInterval) or host_interval == "auto":
        return _auto_levels(host_interval, interval, where)
    if isinstance(host_interval, bool) or not isinstance(host_interval, int) or host_interval < 1:
        raise InputError(
            f"must be an integer >= 1, 'auto' or a TwoLevelInterval, got {host_interval!r}", where=where
        )
    if not isinstance(interval, int):
        raise InputError("a fixed host_interval needs a fixed integer interval (or give 'auto')", where=where)
    if interval % host_interval:
        raise InputError(
            f"interval={interval} must be a multiple of host_interval={host_interval}", where=where
        )
    return host_interval


def _auto_levels(host_interval: Any, interval: Any, where: str) -> TwoLevelInterval:
    if not isinstance(interval, AutoInterval):
        raise InputError(
            "'auto' (or a TwoLevelInterval) chooses h together with H: give interval='auto' or an "
            "AutoInterval",
            where=where,
        )
    if interval.probe_interval < 2:
        raise InputError(
            f"needs the AutoInterval's probe_interval >= 2 (its host syncs are timed between the probe's "
            f"global syncs), got {interval.probe_interval}",
            where=where,
        )
    if host_interval == "auto":
        return TwoLevelInterval(target_ratio=interval.target_ratio, max_interval=interval.max_interval)
    mine = (host_interval.target_ratio, host_interval.max_interval)
    if mine != (interval.target_ratio, interval.max_interval):
        raise InputError(
            f"target_ratio and max_interval {mine} differ from the AutoInterval's "
            f"{(interval.target_ratio, interval.max_interval)}: give the same values to both",
            where=where,
        )
    return host_interval


def make_interval_state(
    interval: Union[int, AutoInterval], host_interval: HostInterval, overlap: bool = False
) -> IntervalState:
    """The strategy's interval state: a :class:`TwoLevelIntervalState` when ``host_interval`` is a
    ``TwoLevelInterval`` (resolved by :func:`resolve_host_interval`), else an ``IntervalState``."""
    if isinstance(host_interval, TwoLevelInterval):
        return TwoLevelIntervalState(interval, host_interval)
    return IntervalState(interval, overlap=overlap)


class TwoLevelIntervalState(IntervalState):
    """H and h of two-level averaging, both chosen from the probe (module docstring).

    Args:
        policy: the ``AutoInterval`` whose phases (warm-up, probe, measured syncs) are run.
        levels: the rule applied to the agreed medians.

    Example:
        >>> s = TwoLevelIntervalState(AutoInterval(), TwoLevelInterval())   # doctest: +SKIP
        >>> int(s.h.numpy()), int(s.interval.numpy())                        # doctest: +SKIP
        (1, 1)
    """

    def __init__(self, policy: AutoInterval, levels: TwoLevelInterval) -> None:
        super().__init__(policy, overlap=False)
        self.levels = levels
        self.hosts = 1  # set by bind()
        self.probe_h = max(1, self.probe_interval // 2)  # the probe's host interval (set after the warm-up)
        self.h = host_variable(1, tf.int64, "skip_correct/host_interval")
        self.t_intra = host_variable(0.0, tf.float64, "skip_correct/t_intra")
        self._intra_cap = (self.probe_interval - 1) * self.measure_syncs
        self.intra_samples = host_variable(
            np.zeros(self._intra_cap), tf.float64, "skip_correct/intra_samples"
        )
        self.n_intra = host_variable(0, tf.int64, "skip_correct/n_intra")

    def bind(self, hosts: int) -> tf.Variable:
        """Know the number of hosts (the rule's ``hosts``); returns h's variable for the averager."""
        self.hosts = int(hosts)
        return self.h

    # ---- in the traced step ------------------------------------------------------------------------
    def _record_more(
        self, steps: tf.Tensor, probing: tf.Tensor, host_synced: Optional[tf.Tensor], sync_dt: tf.Tensor
    ) -> List[Any]:
        """The warm-up's last step sets the probe's h; a probe host sync's seconds (``sync_dt`` when
        ``host_synced``) are a t_intra sample."""
        warm_end = tf.logical_and(self.chosen.read_value() == 0, steps == self.warmup_steps)
        set_h = self.h.assign(tf.where(warm_end, tf.constant(self.probe_h, tf.int64), self.h.read_value()))
        sampled = tf.cond(
            tf.logical_and(probing, host_synced),
            lambda: self._append(self.intra_samples, self.n_intra, self._intra_cap, sync_dt),
            self.n_intra.read_value,
        )
        return [set_h, sampled]

    def _medians(self) -> List[tf.Tensor]:
        """[t_inter, t_comp, t_intra] (t_intra 0 without a sample: a restored run that probes again)."""
        n = tf.minimum(self.n_intra.read_value(), self._intra_cap)
        intra = tf.cond(
            n > 0,
            lambda: median(self.intra_samples.read_value()[:n]),
            lambda: tf.constant(0.0, tf.float64),
        )
        return super()._medians() + [intra]

    def _policy(self, agreed: np.ndarray) -> np.ndarray:
        """The agreed [t_inter, t_comp, t_intra] -> [H, h] (numpy, in the step)."""
        h, m = self.levels.choose(float(agreed[2]), float(agreed[0]), float(agreed[1]), hosts=self.hosts)
        return np.array([m * h, h], np.int64)

    def _set_chosen(self, agreed: tf.Tensor, out: tf.Tensor) -> List[Any]:
        return super()._set_chosen(agreed, out) + [self.h.assign(out[1]), self.t_intra.assign(agreed[2])]

    # ---- eager -------------------------------------------------------------------------------------
    def as_dict(self) -> Dict[str, Any]:
        """IntervalState's keys and ``host_interval`` (h now: 1 in the warm-up, then the probe's until chosen), ``interval_t_intra_s``,
        ``interval_t_inter_s`` (the same as ``interval_t_comm_s``: the global sync) and
        ``interval_t_intra_samples_s`` (this worker's host-sync samples)."""
        out = super().as_dict()
        n = min(int(self.n_intra.numpy()), self._intra_cap)
        out.update(
            host_interval=int(self.h.numpy()),
            interval_t_intra_s=float(self.t_intra.numpy()),
            interval_t_inter_s=float(self.t_comm.numpy()),
            interval_t_intra_samples_s=[round(float(x), 6) for x in self.intra_samples.numpy()[:n]],
        )
        return out

    # ---- checkpoint --------------------------------------------------------------------------------
    def checkpoint_tensors(self) -> Dict[str, tf.Tensor]:
        out = super().checkpoint_tensors()
        out.update(host_interval=self.h.read_value(), interval_t_intra_s=self.t_intra.read_value())
        return out

    def restore_ops(self, restored: Dict[str, Any]) -> list:
        """A restored run keeps the h and H it chose (or probes again if it had not chosen yet)."""
        ops = super().restore_ops(restored)
        for key, var in (("host_interval", self.h), ("interval_t_intra_s", self.t_intra)):
            if key in restored:
                ops.append(var.assign(restored[key]))
        return ops
