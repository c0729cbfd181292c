"""Model builders for the runners: a small MLP, a small CNN and a big MLP (tens of MB of parameters).

Every builder takes the input shape and number of classes and returns an uncompiled tf-keras model
whose output is logits. No dropout or other randomness at training time, so synchronous data
parallelism over R replicas reproduces single-device training with the same global batch.

Example:
    >>> from experiments.models import build_model   # (importing experiments selects tf-keras)
    >>> m = build_model("mlp", (28, 28, 1), 10)                          # doctest: +SKIP
    >>> m.count_params()                                                # doctest: +SKIP
    101770
"""

from __future__ import annotations

from typing import Callable, Dict, Tuple

from tf_commopt.errors import InputError

__all__ = ["build_model", "MODELS", "param_bytes", "held_out_figures"]

MODELS = ("mlp", "cnn", "big_mlp")


def _keras():
    import tf_keras

    return tf_keras


def mlp(input_shape: Tuple[int, ...], num_classes: int, hidden: int = 128):
    """Flatten -> Dense(hidden, relu) -> Dense(num_classes). 101,770 parameters on MNIST."""
    k = _keras()
    return k.Sequential(
        [
            k.layers.Flatten(input_shape=input_shape),
            k.layers.Dense(hidden, activation="relu"),
            k.layers.Dense(num_classes),
        ],
        name="mlp",
    )


def cnn(input_shape: Tuple[int, ...], num_classes: int):
    """Two 3x3 conv + max-pool blocks (16, 32 filters) -> Dense(64) -> logits. 56,714 parameters on MNIST."""
    k = _keras()
    return k.Sequential(
        [
            k.layers.Conv2D(16, 3, activation="relu", input_shape=input_shape),
            k.layers.MaxPooling2D(),
            k.layers.Conv2D(32, 3, activation="relu"),
            k.layers.MaxPooling2D(),
            k.layers.Flatten(),
            k.layers.Dense(64, activation="relu"),
            k.layers.Dense(num_classes),
        ],
        name="cnn",
    )


def big_mlp(input_shape: Tuple[int, ...], num_classes: int, width: int = 2048, depth: int = 3):
    """Flatten -> ``depth`` x Dense(width, relu) -> logits: ~10.1 M parameters (40 MB float32) on MNIST,
    for communication benchmarks where the all-reduce dominates."""
    k = _keras()
    layers = [k.layers.Flatten(input_shape=input_shape)]
    layers += [k.layers.Dense(width, activation="relu") for _ in range(depth)]
    layers.append(k.layers.Dense(num_classes))
    return k.Sequential(layers, name="big_mlp")


_BUILDERS: Dict[str, Callable] = {"mlp": mlp, "cnn": cnn, "big_mlp": big_mlp}


def build_model(name: str, input_shape: Tuple[int, ...], num_classes: int):
    """Build model ``name`` (one of ``MODELS``); InputError naming ``--model`` otherwise."""
    if name not in _BUILDERS:
        raise InputError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}", where="--model")
    return _BUILDERS[name](tuple(input_shape), int(num_classes))


def param_bytes(model) -> int:
    """Bytes of the model's trainable variables (what one all-reduce of the gradients moves per rank)."""
    return int(sum(v.shape.num_elements() * v.dtype.size for v in model.trainable_variables))


def held_out_figures(model, x, y, batch_size: int = 500) -> Tuple[float, float]:
    """(mean cross-entropy, accuracy) of ``model`` (logits) on all of ``x``, ``y``, by direct calls.

    Unlike ``model.evaluate``, the result does not depend on a tf.distribute strategy in scope: inside a
    multi-worker strategy's ``fit`` (a callback), ``evaluate`` shards the data across the workers, so each
    would score its own part of the test set.

    >>> import numpy as np
    >>> m = build_model("mlp", (28, 28, 1), 10)
    >>> loss, acc = held_out_figures(m, np.zeros((3, 28, 28, 1), np.float32), np.zeros(3, np.int64))
    >>> 0.0 <= acc <= 1.0 and loss > 0
    True
    """
    import numpy as np
    import tensorflow as tf

    n, total, right = len(x), 0.0, 0
    for lo in range(0, n, batch_size):
        logits = model(x[lo : lo + batch_size], training=False)
        labels = tf.reshape(tf.cast(y[lo : lo + batch_size], tf.int64), [-1])
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        total += float(np.sum(losses.numpy(), dtype=np.float64))
        right += int(np.sum(np.argmax(logits.numpy(), axis=1) == labels.numpy()))
    return total / n, right / n
