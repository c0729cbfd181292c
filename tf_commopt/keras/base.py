"""The one callback base of tf_commopt: tf-keras's ``Callback``, whatever ``tf.keras`` resolves to.

Our strategies need tf-keras (Keras 3 ``fit`` fails under TensorFlow's multi-worker strategies and its
optimizers all-reduce gradients themselves), so every callback we ship subclasses tf-keras's class —
not ``tf.keras``'s, which is Keras 3 unless ``TF_USE_LEGACY_KERAS=1`` was set before TensorFlow loaded.

Example:
    >>> from tf_commopt.keras.base import Callback   # doctest: +SKIP
    >>> class Mine(Callback): ...                     # doctest: +SKIP
"""

from __future__ import annotations

import tf_keras

__all__ = ["Callback"]

Callback = tf_keras.callbacks.Callback
