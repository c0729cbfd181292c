"""The model a closure trains, as a function of weight tensors: ``forward(params, x, y) -> (loss, metrics)``.

A closure keeps its model copy x_i in tensors (pulled from the ps) through H local steps, so the model
must run on tensors rather than on its variables. For a tf-keras model, each trainable variable is a
plain layer attribute (``Dense.kernel``, ...): while the closure is traced the attribute is swapped for
the tensor and put back after the call (``keras_forward``; the layer's tracking is bypassed, only for
the trace). A model written as a function of its weights is taken as is (``function_forward``).

Example:
    >>> forward = function_forward(lambda params, x, y: tf.reduce_mean((x * params[0] - y) ** 2))
    >>> loss, metrics = forward([tf.constant(2.0)], tf.constant([1.0]), tf.constant([1.0]))
    >>> float(loss), metrics.shape.as_list()
    (1.0, [0])
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

import tensorflow as tf

from tf_commopt._compat import keras_all_layers
from tf_commopt.errors import InputError

__all__ = ["model_forward", "keras_forward", "function_forward", "check_keras_model"]

Metric = Tuple[str, Callable]


def check_keras_model(model: Any, loss: Optional[Callable]) -> None:
    """One-line InputError (``compile``) unless ``model`` is a tf-keras model the closures can run on tensors.

    Refused: a Keras 3 model, a missing ``loss``, regularization losses (their terms read the ps
    variables, not the local copies) and non-trainable weights (e.g. BatchNorm statistics).
    """
    import tf_keras

    if not isinstance(model, tf_keras.Model):
        raise InputError(
            f"model must be a tf-keras model (import tf_keras, or TF_USE_LEGACY_KERAS=1 before "
            f"tensorflow), got {type(model).__module__}.{type(model).__name__}; Keras 3 does "
            "not work under ParameterServerStrategy",
            where="compile",
        )
    if loss is None:
        raise InputError("a Keras model needs loss=", where="compile")
    if model.losses:
        raise InputError(
            f"models with regularization losses ({len(model.losses)}) are not supported by the "
            "parameter-server variant; drop the regularizers or add the term to the loss",
            where="compile",
        )
    if model.non_trainable_weights:
        raise InputError(
            f"non-trainable weights ({model.non_trainable_weights[0].name}) are not supported "
            "by the parameter-server variant",
            where="compile",
        )


def _weight_slots(model: Any) -> List[Tuple[Any, str]]:
    """(layer, attribute) holding each trainable variable, so the model can run on plain tensors."""
    where = {id(v): k for k, v in enumerate(model.trainable_variables)}
    slots: List[Optional[Tuple[Any, str]]] = [None] * len(where)
    for layer in keras_all_layers(model):
        for attr, val in vars(layer).items():
            k = where.get(id(val))
            if k is not None and slots[k] is None:
                slots[k] = (layer, attr)
    missing = [model.trainable_variables[k].name for k, s in enumerate(slots) if s is None]
    if missing:
        raise InputError(
            f"variable {missing[0]} is not a plain layer attribute; pass variables= and loss_fn= "
            "(a function of the weight tensors) instead of a Keras model",
            where="compile",
        )
    return slots  # type: ignore[return-value]


def keras_forward(model: Any, loss: Callable, metrics: Sequence[Metric] = ()) -> Callable:
    """``forward(params, x, y) -> (loss, metric values)``: ``model`` run on the tensors ``params``.

    Args:
        model: a tf-keras model (see :func:`check_keras_model`).
        loss: ``loss(y_true, y_pred)``, a Keras Loss object or a function; its per-example values are averaged.
        metrics: ``(name, fn(y_true, y_pred))`` pairs (per-example values), each averaged over the batch
            (float64, shape ``[len(metrics)]``).

    Example:
        >>> forward = keras_forward(model, tf_keras.losses.MeanSquaredError())   # doctest: +SKIP
    """
    slots = _weight_slots(model)

    def forward(params, x, y):
        saved = [getattr(layer, attr) for layer, attr in slots]
        try:
            for (layer, attr), p in zip(slots, params):
                object.__setattr__(layer, attr, p)  # bypass tracking: only for this trace
            pred = model(x, training=True)
        finally:
            for (layer, attr), v in zip(slots, saved):
                object.__setattr__(layer, attr, v)
        # a Keras Loss object refuses AUTO reduction under a strategy: take its per-example values
        per_example = (
            loss.call(y, pred) if hasattr(loss, "call") and hasattr(loss, "reduction") else loss(y, pred)
        )
        values = [tf.reduce_mean(tf.cast(tf.stop_gradient(fn(y, pred)), tf.float64)) for _, fn in metrics]
        return tf.reduce_mean(per_example), tf.stack(values) if values else tf.zeros([0], tf.float64)

    return forward


def function_forward(loss_fn: Callable) -> Callable:
    """``forward(params, x, y) -> (loss_fn(params, x, y), no metrics)`` for a model written as a function."""

    def forward(params, x, y):
        return loss_fn(params, x, y), tf.zeros([0], tf.float64)

    return forward


def model_forward(
    model: Any = None,
    loss: Optional[Callable] = None,
    variables: Optional[Sequence] = None,
    loss_fn: Optional[Callable] = None,
    metrics: Optional[Sequence[Metric]] = None,
) -> Tuple[List[Any], Callable]:
    """(trainable variables, forward) for ``compile``: a tf-keras ``model`` + ``loss``, or ``variables`` +
    ``loss_fn(params, x, y)``; one-line InputError (``compile``) otherwise.

    Example:
        >>> v = tf.Variable(1.0)
        >>> variables, forward = model_forward(variables=[v], loss_fn=lambda p, x, y: p[0] * x)
        >>> variables == [v]
        True
    """
    if model is not None:
        check_keras_model(model, loss)
        return list(model.trainable_variables), keras_forward(model, loss, list(metrics or ()))
    if variables is not None and loss_fn is not None:
        if metrics:
            raise InputError("metrics= needs a Keras model", where="compile")
        return list(variables), function_forward(loss_fn)
    raise InputError("pass model= and loss=, or variables= and loss_fn=", where="compile")
