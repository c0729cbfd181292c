"""Input pipelines whose iterators are deleted at once: tf.data autotuning off where nothing is tuned.

In TensorFlow 2.21 deleting a tf.data iterator can block for up to 60 s: the deletion waits for the
iterator's autotune thread, which can miss its wake-up and sleep until its next scheduled optimization
(the period doubles from 10 ms up to 60 s). tf-keras deletes its input iterator when ``model.fit``
returns, and Python may delete an old one at any later moment (a garbage collection in the middle of
the next ``fit``). Turning autotuning off removes the thread:

* :func:`no_autotune` for your own dataset (its ``AUTOTUNE`` values fall back to TensorFlow's defaults);
* :func:`device_iterators_without_autotune`, once per process, for the small per-device datasets that
  tf.distribute builds inside every ``MultiDeviceIterator`` (no strategy or dataset option reaches
  them, so this one is process-wide: docs/architecture.md).

The experiment runner and the test suite call both; the library itself never does.

Example:
    >>> import tensorflow as tf
    >>> from tf_commopt.tf.input_teardown import no_autotune
    >>> ds = no_autotune(tf.data.Dataset.range(4).batch(2))
    >>> ds.options().autotune.enabled, [b.tolist() for b in ds.as_numpy_iterator()]
    (False, [[0, 1], [2, 3]])
"""

from __future__ import annotations

from typing import Any

from tf_commopt import _compat

__all__ = ["no_autotune", "device_iterators_without_autotune"]


def no_autotune(dataset: Any) -> Any:
    """``dataset`` with tf.data autotuning off (its other options and elements unchanged).

    Args:
        dataset: a ``tf.data.Dataset``.
    """
    return _compat.no_autotune(dataset)


def device_iterators_without_autotune() -> None:
    """Build the per-device datasets of tf.distribute's input iterators without autotuning, for the rest of
    the process (idempotent). Call it once, before ``fit``."""
    _compat.device_iterators_without_autotune()
