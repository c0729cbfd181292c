"""A compiled tf-keras model's loss and metrics as stateless functions a closure can evaluate.

The closures of a round evaluate the loss and the metrics on each local step's batch, on the shard's
model copy before its update (as tf-keras's training metrics do on the one model), without any state
kept between steps: strings (``"accuracy"`` and ``"crossentropy"`` resolved from the shapes as tf-keras
does, ``"mae"``, ...), functions and mean-type Metric objects (``SparseCategoricalAccuracy()``,
``MeanAbsoluteError()``, ...) qualify; stateful metrics (AUC, Precision, ...) are left out.

Example:
    >>> import tensorflow as tf
    >>> acc = by_shape("accuracy")
    >>> float(acc(tf.constant([1, 0]), tf.constant([[0.1, 0.9], [0.2, 0.8]]))[0])   # sparse labels
    1.0
"""

from __future__ import annotations

import sys
from typing import Any, Callable, List, Tuple

import tensorflow as tf

from tf_commopt import _compat
from tf_commopt.errors import InputError

__all__ = ["compiled_loss", "compiled_metrics", "by_shape"]


def compiled_loss(model: Any) -> Any:
    """The loss a tf-keras model was compiled with, as a callable; one-line InputError if the model is not
    compiled or has several losses.

    Example:
        >>> loss = compiled_loss(model)   # doctest: +SKIP
    """
    import tf_keras

    loss = getattr(model, "loss", None)
    if loss is None or getattr(model, "optimizer", None) is None:
        raise InputError("compile the model (optimizer= and loss=) before fit", where="model")
    if isinstance(loss, (dict, list, tuple)):
        raise InputError(
            "one loss for a single-output model is supported on the parameter-server path, got "
            f"{type(loss).__name__}",
            where="loss",
        )
    return tf_keras.losses.get(loss) if isinstance(loss, str) else loss


def by_shape(kind: str) -> Callable:
    """tf-keras's resolution of ``"accuracy"`` / ``"crossentropy"`` from the shapes (compile_utils.MetricsContainer)."""
    import tf_keras

    m = tf_keras.metrics

    def fn(y_true, y_pred):
        t_shape, p_shape = y_true.shape.as_list(), y_pred.shape.as_list()
        binary = p_shape[-1] == 1
        sparse = len(t_shape) < len(p_shape) or (t_shape[-1] == 1 and p_shape[-1] > 1)
        if kind == "accuracy":
            f = (
                m.binary_accuracy
                if binary
                else m.sparse_categorical_accuracy
                if sparse
                else m.categorical_accuracy
            )
        else:
            f = (
                m.binary_crossentropy
                if binary
                else m.sparse_categorical_crossentropy
                if sparse
                else m.categorical_crossentropy
            )
        return f(y_true, y_pred)

    return fn


def compiled_metrics(model: Any) -> List[Tuple[str, Callable]]:
    """The metrics a tf-keras model was compiled with, as ``(name, fn(y_true, y_pred))`` pairs.

    Stateful ones (AUC, Precision, ...) are left out with a warning on stderr (they need variables that
    live through the epoch; a closure holds none).

    Example:
        >>> [name for name, _ in compiled_metrics(model)]   # doctest: +SKIP
        ['accuracy']
    """
    import tf_keras

    out, skipped = [], []
    for spec in _compat.keras_compiled_metrics(model):
        if isinstance(spec, str) and spec in ("accuracy", "acc", "crossentropy", "ce"):
            out.append((spec, by_shape("accuracy" if spec in ("accuracy", "acc") else "crossentropy")))
            continue
        obj = tf_keras.metrics.get(spec) if isinstance(spec, str) else spec
        name = (
            spec
            if isinstance(spec, str)
            else getattr(obj, "name", None) or getattr(obj, "__name__", "metric")
        )
        fn = (
            _compat.keras_mean_metric_fn(obj)
            if isinstance(obj, tf_keras.metrics.Metric)
            else (obj if callable(obj) else None)
        )
        if fn is None:
            skipped.append(str(name))
        else:
            out.append((str(name), _cast_true(fn)))
    if skipped:
        sys.stderr.write(
            f"tf_commopt: ps fit: compiled metric(s) {', '.join(skipped)} are stateful and not computed "
            "during training on the parameter-server path; model.evaluate() after fit computes them\n"
        )
        sys.stderr.flush()
    return out


def _cast_true(fn: Callable) -> Callable:
    def cast(y_true, y_pred):  # as tf-keras's MeanMetricWrapper: y_true in y_pred's dtype
        return fn(tf.cast(y_true, y_pred.dtype), y_pred)

    return cast
