"""Telemetry of a SkipCorrectStrategy: what one process did (steps, syncs, bytes, seconds).

The counters are plain host variables (on ``/CPU:0``, outside any strategy), updated inside the traced
step, read eagerly by :meth:`Telemetry.as_dict` (``strategy.stats()``). They are telemetry, not model
state: checkpoints do not hold them.

Example:
    >>> t = Telemetry()                       # doctest: +SKIP
    >>> t.as_dict()["syncs"]                  # doctest: +SKIP
    0

Clocks: ``compute_s`` adds, for every step, the wall time from the end of the previous step's
bookkeeping to the start of this one's (forward, backward, local update, input and loop overhead;
the first step after :meth:`reset_clock` adds nothing); ``comm_s`` adds the wall time of every
averaging (read, fused all-reduce, assign); ``first_sync_s`` is the first averaging's (it also sets
up the collective group), so a steady per-sync time is ``(comm_s − first_sync_s) / (syncs − 1)``.
With ``overlap=True`` ``comm_s`` is what the steps waited for at syncs (wait for the in-flight mean, apply,
snapshot, launch) and ``background_comm_s`` (only then in ``as_dict``) adds the background all-reduces'
own wall time: the communication that was (mostly) hidden; ``drain_wait_s`` the seconds spent outside the
steps waiting for and applying an in-flight mean (the end of ``fit``, ``strategy.sync()``; also in ``comm_s``).
With two-level averaging (only then in ``as_dict``): ``host_syncs`` and ``host_comm_s`` count the host
syncs apart from the global ones in ``syncs`` / ``comm_s``; ``inter_host_bytes`` is what this process put
into the collectives across hosts.
"""

from __future__ import annotations

from typing import Any, Dict

import tensorflow as tf

from tf_commopt._compat import host_variable

__all__ = ["Telemetry"]


class Telemetry:
    """Counters and clocks of one process's skip-and-correct steps."""

    def __init__(self, overlap: bool = False, two_level: bool = False) -> None:
        self.overlap = bool(overlap)
        self.two_level = bool(two_level)
        self.host_syncs = host_variable(0, tf.int64, "skip_correct/host_syncs")
        self.host_comm_s = host_variable(0.0, tf.float64, "skip_correct/host_comm_s")
        self.inter_host_bytes = host_variable(0, tf.int64, "skip_correct/inter_host_bytes")
        # overlap=True: seconds of the background all-reduces whose means were applied (hidden or not)
        self.background_comm_s = host_variable(0.0, tf.float64, "skip_correct/background_comm_s")
        # overlap=True: seconds spent outside the steps applying an in-flight mean (end of fit, sync())
        self.drain_s = host_variable(0.0, tf.float64, "skip_correct/drain_s")
        self.steps = host_variable(0, tf.int64, "skip_correct/steps")
        self.syncs = host_variable(0, tf.int64, "skip_correct/syncs")
        self.bytes = host_variable(0, tf.int64, "skip_correct/bytes")
        self.comm_s = host_variable(0.0, tf.float64, "skip_correct/comm_s")
        self.compute_s = host_variable(0.0, tf.float64, "skip_correct/compute_s")
        self.last_end = host_variable(0.0, tf.float64, "skip_correct/last_end")
        # the first averaging also sets up the collective group: kept apart so a steady per-sync time is
        # (comm_s - first_sync_s) / (syncs - 1)
        self.first_sync_s = host_variable(0.0, tf.float64, "skip_correct/first_sync_s")

    def step_time(self) -> tf.Tensor:
        """In a traced step: seconds since the end of the previous step (0 after a clock reset); adds
        them to ``compute_s``."""
        now = tf.timestamp()
        last = self.last_end.read_value()
        dt = tf.where(last > 0.0, now - last, tf.constant(0.0, tf.float64))
        self.compute_s.assign_add(dt)
        return dt

    def add_sync(self, seconds: tf.Tensor, background: Any = None) -> None:
        """In a traced step: one averaging took ``seconds`` (with overlap: the part the step waited for;
        ``background``: the seconds of the background all-reduce applied at this sync)."""
        if background is not None:
            self.background_comm_s.assign_add(background)
        first = self.syncs.read_value() == 0
        self.first_sync_s.assign(tf.where(first, seconds, self.first_sync_s.read_value()))
        self.comm_s.assign_add(seconds)
        self.syncs.assign_add(1)

    def add_host_sync(self, seconds: tf.Tensor) -> None:
        """In a traced step: one host sync of two-level averaging took ``seconds``."""
        self.host_syncs.assign_add(1)
        self.host_comm_s.assign_add(seconds)

    def reset_clock(self) -> None:
        """Forget the end of the last step (a pause, e.g. evaluation, is not compute)."""
        self.last_end.assign(0.0)

    def as_dict(self) -> Dict[str, Any]:
        """The counters as Python numbers (eager)."""
        return (
            {
                "steps": int(self.steps.numpy()),
                "syncs": int(self.syncs.numpy()),
                "comm_s": float(self.comm_s.numpy()),
                "compute_s": float(self.compute_s.numpy()),
                "bytes_communicated": int(self.bytes.numpy()),
                "first_sync_s": float(self.first_sync_s.numpy()),
            }
            | (
                {
                    "background_comm_s": float(self.background_comm_s.numpy()),
                    "drain_wait_s": float(self.drain_s.numpy()),
                }
                if self.overlap
                else {}
            )
            | (
                {
                    "host_syncs": int(self.host_syncs.numpy()),
                    "host_comm_s": float(self.host_comm_s.numpy()),
                    "inter_host_bytes": int(self.inter_host_bytes.numpy()),
                }
                if self.two_level
                else {}
            )
        )
