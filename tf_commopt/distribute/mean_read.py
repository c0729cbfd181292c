"""The mirrored variable of a SkipCorrectStrategy: a cross-replica read is the mean of the local replicas'
copies (between two syncs they differ, and one arbitrary copy would silently be a local model).

Example:
    >>> with SkipCorrectStrategy(interval=4).scope():   # doctest: +SKIP
    ...     v = tf.Variable(1.0)                          # a MeanReadMirroredVariable
"""

from __future__ import annotations

import logging
from typing import Dict

import tensorflow as tf

from tf_commopt._compat import num_workers
from tf_commopt._compat import values as _values

__all__ = ["MeanReadMirroredVariable", "warn_once"]

_log = logging.getLogger("tf_commopt.distribute")
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
