"""What a read sees between two syncs of a SkipCorrectStrategy: a cross-replica read of a mirrored variable
is the mean of the local replicas' copies (they differ, and one arbitrary copy would silently be a local
model); a metric read inside the training step is this worker's (no collective between syncs).

Example:
    >>> with SkipCorrectStrategy(interval=4).scope():   # doctest: +SKIP
    ...     v = tf.Variable(1.0)                          # a MeanReadMirroredVariable
"""

from __future__ import annotations

import logging
from typing import Any, Dict

import tensorflow as tf

from tf_commopt._compat import num_workers
from tf_commopt._compat import values as _values

__all__ = ["MeanReadMirroredVariable", "BetweenSyncReads", "warn_once"]

_log = logging.getLogger("tf_commopt.distribute")
_no_autograph = tf.autograph.experimental.do_not_convert
_WARNED: Dict[str, bool] = {}


def warn_once(key: str, message: str) -> None:
    """Log ``message`` once per process for ``key`` (the logger ``tf_commopt.distribute``)."""
    if not _WARNED.get(key):
        _WARNED[key] = True
        _log.warning(message)


class MeanReadMirroredVariable(_values.MirroredVariable):
    """A MirroredVariable whose cross-replica read is the mean of the local replicas' copies.

    Between two syncs the replicas hold different values; reading one arbitrary copy would silently
    return a local model. Saving uses the same read, so checkpoints hold the (local) mean.
    """

    def _get_cross_replica(self):
        comps = self.values
        if not self.dtype.is_floating or len(comps) == 1:
            if self.dtype.is_floating and num_workers(self.distribute_strategy) > 1:
                warn_once(
                    "mw_read",
                    "SkipCorrectStrategy: a variable read in cross-replica context on a "
                    "multi-worker cluster is this worker's copy; it is the global model only right "
                    "after a sync (call strategy.sync() first)",
                )
            return tf.identity(comps[0].read_value())
        with tf.device(comps[0].device):
            return tf.add_n([c.read_value() for c in comps]) / tf.cast(len(comps), self.dtype)


class BetweenSyncReads:
    """The StrategyExtended mixin for metric reads (needs ``self._sc_train_graphs``, the traced steps' graphs)."""

    @_no_autograph
    def _sc_in_train_graph(self) -> bool:
        g = tf.compat.v1.get_default_graph()
        while g is not None:
            if g in self._sc_train_graphs:
                return True
            g = getattr(g, "outer_graph", None)
        return False

    @_no_autograph
    def _reduce(self, reduce_op: Any, value: Any) -> Any:
        """``strategy.reduce(op, v, axis=None)``; the path of every cross-replica read of a SyncOnRead
        variable (tf-keras metric totals and counts read by ``Metric.result()``).

        On a multi-worker cluster, inside a traced step that runs skip-and-correct updates, a metric read
        is reduced over this worker's replicas only: no collective, sync step or not. Everywhere else
        (``evaluate``, eager reads) it is the usual reduction over all workers — and tf-keras re-reads
        every metric eagerly at an epoch's end, so the epoch's values (History, the progress bar's final
        line, callbacks' ``on_epoch_end`` logs) are global, as under MultiWorkerMirroredStrategy; the
        per-batch values in between are this worker's running means.
        """
        if (
            num_workers(self) > 1
            and isinstance(value, _values.SyncOnReadVariable)
            and not tf.executing_eagerly()
            and self._sc_in_train_graph()
        ):
            comps = list(value.values)
            with tf.device(comps[0].device):
                total = tf.add_n([c.read_value() for c in comps]) if len(comps) > 1 else comps[0].read_value()
                if reduce_op == tf.distribute.ReduceOp.MEAN and len(comps) > 1:
                    total = total / tf.cast(len(comps), total.dtype)
                return tf.identity(total)
        return super()._reduce(reduce_op, value)
