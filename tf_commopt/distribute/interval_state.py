"""The communication interval H of a SkipCorrectStrategy at run time: the policy's state in the step.

A fixed H is one host variable. An :class:`~tf_commopt.distribute.interval_policy.AutoInterval` (the
policy: its phases and its rule are documented there) keeps here its probe samples, the agreed medians
and what choosing cost; :meth:`IntervalState.effective` gives the H of a step and
:meth:`IntervalState.record` feeds it the step's timings. A t_comp sample is the wall time between two
steps' bookkeeping (input and loop overhead count); a t_comm sample the sync's wall time (with
``overlap=True``: the background all-reduce applied at that sync). A probe sync comes after
``probe_interval − 1`` idle local steps, so it is timed as later syncs will run.

``stats()`` reports the agreed medians, this worker's samples (the spread) and the seconds the
selection cost (``interval_overhead_s``: agreement + policy; ``interval_selection_comm_s``: all sync
seconds before H was fixed).

Checkpoints (``SkipCorrectState``) hold H, whether it was chosen and the agreed medians: a restored
run keeps its H; one restored before H was chosen measures again.

Two-level averaging with ``host_interval="auto"`` uses the subclass in ``two_level_interval.py`` (h
chosen with H, from one more median: the host syncs').

Example:
    >>> s = IntervalState(AutoInterval())        # doctest: +SKIP
    >>> int(s.interval.numpy()), s.auto           # doctest: +SKIP
    (1, True)
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Union

import numpy as np
import tensorflow as tf

from tf_commopt._compat import host_variable
from tf_commopt.distribute.interval_policy import AutoInterval

__all__ = ["IntervalState", "median"]


def median(values: tf.Tensor) -> tf.Tensor:
    """Median of a 1-D float tensor with at least one element (mean of the middle two for even n).

    >>> float(median(tf.constant([3.0, 1.0, 2.0, 10.0])))   # doctest: +SKIP
    2.5
    """
    s = tf.sort(values)
    n = tf.shape(s)[0]
    return (s[(n - 1) // 2] + s[n // 2]) / 2


class IntervalState:
    """H, and for an :class:`AutoInterval` the probe samples, the agreed medians and the selection cost.

    Args:
        policy: a fixed H (int ≥ 1) or an ``AutoInterval`` (validated: see ``resolve_interval``).
        overlap: syncs are overlapped (``AutoInterval.choose(..., overlap=True)``).
    """

    def __init__(self, policy: Union[int, AutoInterval], overlap: bool = False) -> None:
        self.auto = isinstance(policy, AutoInterval)
        self.policy = policy if self.auto else None
        self.overlap = bool(overlap)
        auto = policy if self.auto else AutoInterval()
        self.warmup_steps = auto.warmup_steps
        self.probe_interval = auto.probe_interval
        self.measure_syncs = auto.measure_syncs
        self.interval = host_variable(1 if self.auto else int(policy), tf.int64, "skip_correct/interval")
        self.chosen = host_variable(0, tf.int64, "skip_correct/auto_done")
        self.t_comm = host_variable(0.0, tf.float64, "skip_correct/t_comm")
        self.t_comp = host_variable(0.0, tf.float64, "skip_correct/t_comp")
        self.overhead_s = host_variable(0.0, tf.float64, "skip_correct/interval_overhead_s")
        self.selection_comm_s = host_variable(0.0, tf.float64, "skip_correct/selection_comm_s")
        # probe samples: enough room for every step of the probe phase
        self._comp_cap = self.probe_interval * self.measure_syncs + 1
        self.comp_samples = host_variable(np.zeros(self._comp_cap), tf.float64, "skip_correct/comp_samples")
        self.comm_samples = host_variable(
            np.zeros(self.measure_syncs), tf.float64, "skip_correct/comm_samples"
        )
        self.n_comp = host_variable(0, tf.int64, "skip_correct/n_comp")
        self.n_comm = host_variable(0, tf.int64, "skip_correct/n_comm")

    # ---- in the traced step ------------------------------------------------------------------------
    def effective(self, steps: tf.Tensor) -> tf.Tensor:
        """H for the step numbered ``steps`` (1-based, this strategy's count)."""
        h = self.interval.read_value()
        if not self.auto:
            return h
        return tf.where(self.probing(steps), tf.constant(self.probe_interval, tf.int64), h)

    def probing(self, steps: tf.Tensor) -> tf.Tensor:
        """Whether this step's timings are probe samples (auto only)."""
        return tf.logical_and(self.chosen.read_value() == 0, steps > self.warmup_steps)

    def record(
        self,
        steps: tf.Tensor,
        step_dt: tf.Tensor,
        did_sync: tf.Tensor,
        sync_dt: tf.Tensor,
        comm_total: tf.Tensor,
        agree: Callable[[tf.Tensor], tf.Tensor],
        host_synced: Optional[tf.Tensor] = None,
    ) -> tf.Tensor:
        """Record this step's samples while probing; at the last probe sync choose H (every worker takes
        this branch at the same step: same counters). ``agree`` MEAN-all-reduces a small float64 vector
        (the medians). ``host_synced``: with two-level averaging, whether this step ran a host sync (its
        seconds in ``sync_dt``), for :meth:`_record_more`. Returns H chosen at this step, or 0."""
        probing = self.probing(steps)
        more = self._record_more(steps, probing, host_synced, sync_dt)

        def sample() -> tf.Tensor:
            counted = self._append(self.comp_samples, self.n_comp, self._comp_cap, step_dt)
            with tf.control_dependencies([counted]):
                return tf.cond(
                    did_sync,
                    lambda: self._on_sync(sync_dt, comm_total, agree),
                    lambda: tf.constant(0, tf.int64),
                )

        with tf.control_dependencies(more):
            return tf.cond(probing, sample, lambda: tf.constant(0, tf.int64))

    def _record_more(
        self, steps: tf.Tensor, probing: tf.Tensor, host_synced: Optional[tf.Tensor], sync_dt: tf.Tensor
    ) -> List[Any]:
        """Ops a subclass records before this step's samples (none here)."""
        return []

    def _append(self, buf: Any, count: Any, cap: int, value: tf.Tensor) -> tf.Tensor:
        """buf[count] = value while there is room (``cap``), and count += 1 either way; the new count."""
        i = count.read_value()
        stored = tf.cond(i < cap, lambda: self._put(buf, i, value), lambda: tf.constant(0, tf.int64))
        with tf.control_dependencies([stored]):
            return count.assign_add(1)

    @staticmethod
    def _put(buf: Any, i: tf.Tensor, value: tf.Tensor) -> tf.Tensor:
        upd = buf.scatter_nd_update(tf.reshape(i, [1, 1]), tf.reshape(tf.cast(value, tf.float64), [1]))
        with tf.control_dependencies([upd]):
            return tf.constant(0, tf.int64)

    def _on_sync(
        self, sync_dt: tf.Tensor, comm_total: tf.Tensor, agree: Callable[[tf.Tensor], tf.Tensor]
    ) -> tf.Tensor:
        j = self.n_comm.read_value()
        put = self._put(self.comm_samples, j, sync_dt)
        with tf.control_dependencies([put]):
            n = self.n_comm.assign_add(1)
        return tf.cond(
            n >= self.measure_syncs, lambda: self._choose(comm_total, agree), lambda: tf.constant(0, tf.int64)
        )

    def _choose(self, comm_total: tf.Tensor, agree: Callable[[tf.Tensor], tf.Tensor]) -> tf.Tensor:
        t0 = tf.timestamp()
        with tf.control_dependencies([t0]):
            agreed = agree(tf.stack(self._medians()))
        with tf.device("/CPU:0"):
            out = tf.numpy_function(self._policy, [agreed], tf.int64, stateful=True)
            out = tf.reshape(out, [-1])
        ops = self._set_chosen(agreed, out)
        ops += [self.chosen.assign(1), self.selection_comm_s.assign(comm_total)]
        with tf.control_dependencies(ops):
            t1 = tf.timestamp()
        self.overhead_s.assign_add(t1 - t0)
        with tf.control_dependencies(ops):
            return tf.identity(out[0])

    def _medians(self) -> List[tf.Tensor]:
        """This worker's medians, in the order the workers agree on them: [t_comm, t_comp]."""
        n_comp = tf.minimum(self.n_comp.read_value(), self._comp_cap)
        return [median(self.comm_samples.read_value()), median(self.comp_samples.read_value()[:n_comp])]

    def _policy(self, agreed: np.ndarray) -> np.ndarray:
        """The agreed medians -> [H] (numpy, in the step)."""
        return np.array(
            [self.policy.choose(float(agreed[0]), float(agreed[1]), overlap=self.overlap)], np.int64
        )

    def _set_chosen(self, agreed: tf.Tensor, out: tf.Tensor) -> List[Any]:
        """Assign what :meth:`_policy` chose (``out``) and the agreed medians they were chosen from."""
        return [self.interval.assign(out[0]), self.t_comm.assign(agreed[0]), self.t_comp.assign(agreed[1])]

    # ---- eager -------------------------------------------------------------------------------------
    def next_interval(self, steps_done: int) -> int:
        """H of the step after ``steps_done`` (this strategy's step count), read eagerly: the probe H
        while an ``AutoInterval`` measures, else the current H (1 during its warm-up)."""
        if self.auto and int(self.chosen.numpy()) == 0 and steps_done + 1 > self.warmup_steps:
            return self.probe_interval
        return int(self.interval.numpy())

    def set(self, interval: int) -> None:
        """Set H from outside (``strategy.set_interval``): an "auto" selection still under way ends here,
        the caller's H wins."""
        self.interval.assign(int(interval))
        if self.auto:
            self.chosen.assign(1)

    def as_dict(self) -> Dict[str, Any]:
        """``interval`` and, for auto, the selection's figures (see the module docstring)."""
        out: Dict[str, Any] = {"interval": int(self.interval.numpy())}
        if self.auto:
            n_comp = min(int(self.n_comp.numpy()), self._comp_cap)
            n_comm = min(int(self.n_comm.numpy()), self.measure_syncs)
            out.update(
                {
                    "interval_chosen": int(self.chosen.numpy()),
                    "interval_t_comm_s": float(self.t_comm.numpy()),
                    "interval_t_comp_s": float(self.t_comp.numpy()),
                    "interval_overhead_s": float(self.overhead_s.numpy()),
                    "interval_selection_comm_s": float(self.selection_comm_s.numpy()),
                    "interval_t_comm_samples_s": [
                        round(float(x), 6) for x in self.comm_samples.numpy()[:n_comm]
                    ],
                    "interval_t_comp_samples_s": [
                        round(float(x), 6) for x in self.comp_samples.numpy()[:n_comp]
                    ],
                }
            )
        return out

    # ---- checkpoint --------------------------------------------------------------------------------
    def checkpoint_tensors(self) -> Dict[str, tf.Tensor]:
        out = {"interval": self.interval.read_value()}
        if self.auto:
            out.update(
                {
                    "interval_chosen": self.chosen.read_value(),
                    "interval_t_comm_s": self.t_comm.read_value(),
                    "interval_t_comp_s": self.t_comp.read_value(),
                }
            )
        return out

    def restore_ops(self, restored: Dict[str, Any]) -> list:
        """A restored auto run keeps the H it chose; a fixed H is the constructor's, not the file's."""
        if not self.auto:
            return []
        ops = [self.interval.assign(restored["interval"])]
        for key, var in (
            ("interval_chosen", self.chosen),
            ("interval_t_comm_s", self.t_comm),
            ("interval_t_comp_s", self.t_comp),
        ):
            if key in restored:
                ops.append(var.assign(restored[key]))
        return ops
