"""``model.fit`` on a GroupedHybridTrainer: the step replacing ``model.train_step``, and the checks that
batches have the static size the groups' micro-batches need.

Example:
    >>> strategy.compile(model, optimizer, loss, metrics=["accuracy"])    # doctest: +SKIP
    >>> model.fit(dataset.batch(64, drop_remainder=True), epochs=2)       # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from tf_commopt import use_tf_keras

use_tf_keras()  # before TensorFlow loads: tf.keras is tf-keras
import tensorflow as tf

from tf_commopt._compat import keras_nested_outputs
from tf_commopt.errors import InputError

__all__ = ["check_static_batches", "keras_train_step", "wrap_fit"]

_WHERE = "GroupedHybridTrainer model.fit"
_MSG = (
    "batches need a static size: use dataset.batch(B, drop_remainder=True) (a partial last batch "
    "cannot be split into the groups' fixed micro-batches)"
)


def check_static_batches(x: Any, batch_size: Optional[int]) -> None:
    """One-line InputError before ``model.fit`` traces if a batch could be partial."""
    if isinstance(x, tf.data.Dataset):
        spec = tf.nest.flatten(x.element_spec)[0]
        if spec.shape.rank is None or spec.shape[0] is None:
            raise InputError(_MSG, where=_WHERE)
    elif x is not None and hasattr(tf.nest.flatten(x)[0], "shape"):
        n, b = int(tf.nest.flatten(x)[0].shape[0]), int(batch_size or 32)
        if n % b:
            raise InputError(
                f"{n} samples leave a partial last batch of {n % b} with batch_size={b}; " + _MSG,
                where=_WHERE,
            )


def keras_train_step(trainer: Any, data: Any) -> Dict[str, tf.Tensor]:
    """``model.train_step`` replacement: the hybrid step, then the user's model gets group 0's weights
    (so evaluate/predict/save see the trained model); the compiled loss and metrics are computed on the
    step's own predictions (the pipelines' outputs, groups in batch order)."""
    import tf_keras as keras

    x, y, sw = keras.utils.unpack_x_y_sample_weight(data)
    first = tf.nest.flatten(x)[0]
    if first.shape.rank is None or first.shape[0] is None:
        raise InputError(
            "the batch size must be static: batch the dataset with " + _MSG.split(": use ")[1], where=_WHERE
        )
    if sw is not None:
        raise InputError("sample weights are not supported", where=_WHERE)
    trainer._step(x, y)
    trainer.assign_model(tf.identity)
    runs = trainer.last_runs
    preds = [run.predictions() for run in runs]
    flat = [
        tf.concat([tf.identity(p[k]) for p in preds], 0) if len(runs) > 1 else preds[0][k]
        for k in range(len(preds[0]))
    ]
    y_pred = tf.nest.pack_sequence_as(keras_nested_outputs(trainer.model), flat)
    trainer.model.compute_loss(x, y, y_pred, None)  # the loss tracker: the batch's mean loss, as the step's
    return trainer.model.compute_metrics(x, y, y_pred, None)


def wrap_fit(trainer: Any, model: Any) -> None:
    """Make ``model.fit`` run the hybrid step, check batch sizes first and start from the model's current
    weights (loaded or restored after compile)."""
    model.train_step = lambda data: keras_train_step(trainer, data)
    fit = model.fit

    def fit_from_current_weights(*args: Any, **kwargs: Any) -> Any:
        check_static_batches(
            args[0] if args else kwargs.get("x"), kwargs.get("batch_size", args[2] if len(args) > 2 else None)
        )
        trainer.push_model()
        return fit(*args, **kwargs)

    model.fit = fit_from_current_weights
