"""The one callback base of tf_commopt: tf-keras's ``Callback``, whatever ``tf.keras`` resolves to.

Our strategies need tf-keras (Keras 3 ``fit`` fails under TensorFlow's multi-worker strategies and its
optimizers all-reduce gradients themselves), so every callback we ship subclasses tf-keras's class —
not ``tf.keras``'s, which is Keras 3 unless ``TF_USE_LEGACY_KERAS=1`` was set before TensorFlow loaded.

It lives outside ``tf_commopt.keras`` and ``tf_commopt.distribute`` so both can use it without importing
each other.

Example:
    >>> from tf_commopt._keras_callback import Callback   # doctest: +SKIP
    >>> class Mine(Callback): ...                     # doctest: +SKIP
"""

from __future__ import annotations

import tf_keras

__all__ = ["Callback"]

Callback = tf_keras.callbacks.Callback
