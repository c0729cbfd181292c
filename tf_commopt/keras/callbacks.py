"""Telemetry for SkipCorrectStrategy in Keras: compute time per step, communication time and bytes per
sync, the current H — in the Keras logs and as TensorBoard scalars; optional interval policy hook.

Example:
    >>> from tf_commopt.keras.callbacks import SkipCorrectTelemetry      # doctest: +SKIP
    >>> model.fit(x, y, epochs=3, callbacks=[SkipCorrectTelemetry(log_dir="/tmp/tb")])  # doctest: +SKIP
    >>> history.history["sc_comm_s_per_sync"]                            # doctest: +SKIP

Keys added to the epoch logs (numbers for that epoch, this process):
``sc_interval`` (H at the end of the epoch), ``sc_steps``, ``sc_syncs``, ``sc_compute_s_per_step``,
``sc_comm_s_per_sync``, ``sc_bytes_per_sync``, ``sc_bytes`` (total this epoch). With
``update_freq="batch"`` the batch logs get ``sc_interval`` and ``sc_syncs`` too (a few scalar reads).

Timing: communication time is measured in the graph around the fused all-reduce (tf.timestamp);
compute time is the wall time between the ends of two consecutive steps minus communication. The
callback resets that clock at the start of each epoch so evaluation and callbacks are not counted.

``interval_policy``: an object with ``choose(t_comm_s, t_comp_s) -> int`` (e.g.
``tf_commopt.core.interval.FirstIterationPolicy``); after ``policy_after_steps`` steps of an
``interval="auto"`` strategy (which starts at H = 1) the callback calls it once with the measured
per-sync communication and per-step compute time and sets H. On a cluster every worker must choose the
same H (average the timings first, e.g. with ``agree_on_timings``); this callback does not communicate.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import tensorflow as tf

from tf_commopt._keras_callback import Callback as _Base  # the one callback base

__all__ = ["SkipCorrectTelemetry"]


def _scalar(tag: str, value: float, step: int) -> None:
    """A TensorBoard scalar (the 'scalars' plugin) written without needing the tensorboard package."""
    from tensorflow.core.framework import summary_pb2

    meta = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
    )
    tf.summary.write(tag, tf.constant(value, tf.float32), step=step, metadata=meta.SerializeToString())


class SkipCorrectTelemetry(_Base):
    """Adds skip-and-correct telemetry to the Keras logs and (optionally) TensorBoard."""

    def __init__(
        self,
        strategy: Any = None,
        log_dir: Optional[str] = None,
        update_freq: str = "epoch",
        interval_policy: Any = None,
        policy_after_steps: int = 5,
    ):
        super().__init__()
        if update_freq not in ("epoch", "batch"):
            from tf_commopt.errors import InputError

            raise InputError(
                f"update_freq must be 'epoch' or 'batch', got {update_freq!r}", where="SkipCorrectTelemetry"
            )
        self._strategy = strategy
        self._log_dir = log_dir
        self._update_freq = update_freq
        self._policy = interval_policy
        self._policy_after = int(policy_after_steps)
        self._policy_done = False
        self._writer = None
        self._epoch_start: Dict[str, float] = {}

    @property
    def needs_every_step(self) -> bool:
        """True while an ``interval_policy`` waits for its step: ``model.fit`` then runs one step per call
        (no graph loop, :mod:`tf_commopt.distribute.graph_loop`), so H is set at the step asked for."""
        return self._policy is not None and not self._policy_done

    def _strat(self) -> Any:
        if self._strategy is None:
            self._strategy = self.model.distribute_strategy
        from tf_commopt.distribute.skip_correct import SkipCorrectStrategy

        return self._strategy if isinstance(self._strategy, SkipCorrectStrategy) else None

    def on_train_begin(self, logs=None):
        s = self._strat()
        if s is not None:
            s.reset_step_clock()
        if self._log_dir and self._writer is None:
            self._writer = tf.summary.create_file_writer(self._log_dir)

    def on_epoch_begin(self, epoch, logs=None):
        s = self._strat()
        if s is not None:
            s.reset_step_clock()
            self._epoch_start = s.stats()

    def on_train_batch_end(self, batch, logs=None):
        s = self._strat()
        if s is None:
            return
        if self._policy is not None and not self._policy_done and s.auto_interval:
            st = s.stats()
            if st["steps"] >= self._policy_after and st["syncs"] > 0:
                h = self._policy.choose(
                    t_comm_s=st["comm_s"] / st["syncs"], t_comp_s=st["compute_s"] / max(st["steps"] - 1, 1)
                )
                s.set_interval(int(h))
                self._policy_done = True
        if self._update_freq == "batch" and logs is not None:
            st = s.stats()
            logs["sc_interval"] = st["interval"]
            logs["sc_syncs"] = st["syncs"]

    def on_epoch_end(self, epoch, logs=None):
        s = self._strat()
        if s is None:
            return
        now = s.stats()
        start = self._epoch_start or {k: 0 for k in now}
        steps = now["steps"] - start["steps"]
        syncs = now["syncs"] - start["syncs"]
        d_bytes = now["bytes_communicated"] - start["bytes_communicated"]
        out = {
            "sc_interval": float(now["interval"]),
            "sc_steps": float(steps),
            "sc_syncs": float(syncs),
            "sc_compute_s_per_step": (now["compute_s"] - start["compute_s"]) / max(steps - 1, 1),
            "sc_comm_s_per_sync": (now["comm_s"] - start["comm_s"]) / syncs if syncs else 0.0,
            "sc_bytes_per_sync": float(d_bytes) / syncs if syncs else 0.0,
            "sc_bytes": float(d_bytes),
        }
        if logs is not None:
            logs.update(out)
        if self._writer is not None and s.extended.should_save_summary:
            with self._writer.as_default():
                for k, v in out.items():
                    _scalar(k, v, epoch)
            self._writer.flush()

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None
