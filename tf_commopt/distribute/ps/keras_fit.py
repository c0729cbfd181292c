"""``model.fit`` on a parameter-server cluster: epochs of skip-and-correct rounds behind tf-keras's interface.

Example (the chief; see docs/parameter_server.md)::

    trainer = ParameterServerSkipCorrect(interval="auto")      # correction="auto": vrl for SGD, else gradient
    with trainer.scope():
        model = tf_keras.Sequential([...])
        model.compile(optimizer=tf_keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    wrap(model)                                                # this instance's fit runs rounds
    history = model.fit(x, y, batch_size=64, epochs=3)         # or model.fit(dataset_fn, steps_per_epoch=...)

An epoch of ``steps_per_epoch`` global steps runs as rounds of H local steps
(``ParameterServerSkipCorrect.run_round``); the last round of an epoch is cut to the steps left (no
re-trace). The model's compiled optimizer runs as a tensor rule (``rules.py``) with its slots per shard
on the ps; its loss and metrics as stateless functions (``metrics.py``). Callbacks get
``on_train_begin/end``, ``on_epoch_begin/end`` and ``on_train_batch_begin/end`` once per round (with the
index of the round's last step); the returned ``History`` holds each epoch's mean loss and metrics over
its local steps and shards. ``validation_data=(x, y)`` is evaluated on :func:`chief_copy` at epoch ends.

Data: arrays ``x, y`` (``batch_size`` is the global batch, split over the K shards; shard i = rows
i, i + K, ...; ``shuffle=True`` permutes the rows once, with ``seed``, before sharding), or a dataset
function ``dataset_fn(input_context)`` (or ``dataset_fn(input_context, step)``, or a
``tf_keras.utils.experimental.DatasetCreator``) with ``steps_per_epoch``, called per shard inside the
closure (``data.DatasetFnSource``).
"""

from __future__ import annotations

import types
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from tf_commopt import _compat
from tf_commopt.distribute.ps.data import DatasetFnSource, array_batch_fn
from tf_commopt.distribute.ps.metrics import compiled_loss, compiled_metrics
from tf_commopt.distribute.ps.trainer import ParameterServerSkipCorrect, trainer_for
from tf_commopt.errors import InputError

__all__ = ["fit", "wrap", "prepare", "chief_copy"]

# trainer -> the data arguments it was last prepared for (a fit with the same ones does not re-trace)
_DATA_KEYS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

_FIT_ARGS = (
    "x",
    "y",
    "batch_size",
    "epochs",
    "verbose",
    "callbacks",
    "shuffle",
    "initial_epoch",
    "steps_per_epoch",
    "validation_data",
    "validation_batch_size",
    "validation_freq",
)


def _source(
    trainer: ParameterServerSkipCorrect,
    x: Any,
    y: Any,
    batch_size: Optional[int],
    shuffle: bool,
    steps_per_epoch: Optional[int],
    seed: int,
):
    """(data source, steps_per_epoch, a key that changes when the data does)."""
    k = trainer.num_shards if trainer.compiled else trainer.num_workers
    if isinstance(x, tf.data.Dataset):
        raise InputError(
            "a tf.data.Dataset is one stream, so a shard's batches would depend on which worker ran "
            "it; pass a dataset_fn(input_context) (as with ParameterServerStrategy) or arrays",
            where="x",
        )
    if callable(x):  # dataset_fn or DatasetCreator
        if y is not None:
            raise InputError("y must be None with a dataset function (it yields (x, y))", where="y")
        if not isinstance(steps_per_epoch, int) or isinstance(steps_per_epoch, bool) or steps_per_epoch < 1:
            raise InputError(
                f"a dataset function needs steps_per_epoch (an integer >= 1), got {steps_per_epoch!r}",
                where="steps_per_epoch",
            )
        return DatasetFnSource(x, k), steps_per_epoch, ("fn", id(x))
    if x is None or y is None:
        raise InputError("pass arrays x and y, or a dataset_fn(input_context) as x", where="x")
    key = ("arrays", id(x), id(y), batch_size, bool(shuffle), seed)  # the caller's arrays, before any copy
    x, y = np.asarray(x), np.asarray(y)
    if len(x) != len(y):
        raise InputError(f"x has {len(x)} rows but y has {len(y)}", where="y")
    batch_size = 32 if batch_size is None else batch_size
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < k or batch_size % k:
        raise InputError(
            f"the global batch must be a positive multiple of the {k} shards, got {batch_size!r}",
            where="batch_size",
        )
    if len(x) < batch_size:
        raise InputError(f"{len(x)} rows cannot fill one global batch of {batch_size}", where="x")
    if shuffle:
        perm = np.random.RandomState(seed).permutation(len(x))
        x, y = x[perm], y[perm]
    if steps_per_epoch is None:
        steps_per_epoch = len(x) // batch_size
    elif isinstance(steps_per_epoch, bool) or not isinstance(steps_per_epoch, int) or steps_per_epoch < 1:
        raise InputError(f"must be an integer >= 1, got {steps_per_epoch!r}", where="steps_per_epoch")
    return array_batch_fn(x, y, num_shards=k, batch_size=batch_size // k), steps_per_epoch, key


def _trainer_of(model: Any, trainer: Optional[ParameterServerSkipCorrect]) -> ParameterServerSkipCorrect:
    import tf_keras

    if not isinstance(model, tf_keras.Model):
        raise InputError(
            f"must be a tf-keras model, got {type(model).__module__}.{type(model).__name__}", where="model"
        )
    trainer = trainer or trainer_for(getattr(model, "distribute_strategy", None))
    if trainer is None:
        raise InputError(
            "build the model inside a ParameterServerSkipCorrect's scope() (its variables live on the "
            "ps tasks)",
            where="model",
        )
    return trainer


def prepare(
    model: Any,
    x: Any = None,
    y: Any = None,
    batch_size: Optional[int] = None,
    shuffle: bool = True,
    steps_per_epoch: Optional[int] = None,
    trainer: Optional[ParameterServerSkipCorrect] = None,
    seed: int = 0,
) -> Tuple[ParameterServerSkipCorrect, int]:
    """What :func:`fit` does before training: compile the model's trainer for this data (or switch its data).
    Returns (trainer, steps_per_epoch). Call it to ``trainer.restore_latest(dir)`` before ``fit``; a ``fit``
    with the same data arguments then does not re-trace.

    Example:
        >>> trainer, _ = prepare(model, x, y, batch_size=64)          # doctest: +SKIP
        >>> trainer.restore_latest("/tmp/ps_backup")                  # doctest: +SKIP
    """
    trainer = _trainer_of(model, trainer)
    loss = compiled_loss(model)
    source, steps_per_epoch, key = _source(trainer, x, y, batch_size, shuffle, steps_per_epoch, seed)
    if not trainer.compiled:
        trainer.compile(
            model,
            loss=loss,
            batch_fn=source,
            num_shards=source.num_shards,
            optimizer=model.optimizer,
            metrics=compiled_metrics(model),
        )
    elif trainer.model is not model:
        raise InputError(
            "this trainer trains another model; build a ParameterServerSkipCorrect per model", where="model"
        )
    elif _DATA_KEYS.get(trainer) != key:
        trainer.set_data(source)
    _DATA_KEYS[trainer] = key
    return trainer, steps_per_epoch


def _check_fit_args(
    model: Any,
    trainer: Optional[ParameterServerSkipCorrect],
    epochs: Any,
    initial_epoch: Any,
    callbacks: Any,
    validation_data: Any,
    validation_freq: Any,
    unsupported: Dict[str, Any],
) -> Tuple[ParameterServerSkipCorrect, List[Any]]:
    """(trainer, callbacks) for :func:`fit`, or a one-line InputError naming the bad argument."""
    import tf_keras

    if unsupported:
        name = sorted(unsupported)[0]
        raise InputError(
            f"fit({name}=...) is not supported on the parameter-server path (supported: {', '.join(_FIT_ARGS)})",
            where=name,
        )
    trainer = _trainer_of(model, trainer)
    for name, val, low in (("epochs", epochs, 1), ("initial_epoch", initial_epoch, 0)):
        if isinstance(val, bool) or not isinstance(val, int) or val < low:
            raise InputError(f"must be an integer >= {low}, got {val!r}", where=name)
    cbs = list(getattr(callbacks, "callbacks", callbacks) or [])
    if any(isinstance(cb, tf_keras.callbacks.BackupAndRestore) for cb in cbs):
        raise InputError(
            "BackupAndRestore does not hold the per-shard corrections and optimizer slots of the "
            "parameter-server path; use trainer.save(dir) / trainer.restore_latest(dir)",
            where="callbacks",
        )
    if validation_data is not None and not (
        isinstance(validation_data, (tuple, list)) and len(validation_data) == 2
    ):
        raise InputError(
            "must be a pair (x_val, y_val) of arrays on the parameter-server path, got "
            f"{type(validation_data).__name__}",
            where="validation_data",
        )
    if isinstance(validation_freq, bool) or not isinstance(validation_freq, int) or validation_freq < 1:
        raise InputError(f"must be an integer >= 1, got {validation_freq!r}", where="validation_freq")
    return trainer, cbs


def _run_epoch(
    trainer: ParameterServerSkipCorrect, cb: Any, model: Any, steps_per_epoch: int
) -> Dict[str, Any]:
    """One epoch of rounds of H local steps, the last one cut to the steps left; returns the epoch's logs
    (running means of the loss and metrics over its local steps)."""
    done, sums, logs = 0, {}, {}
    while done < steps_per_epoch:
        m = min(trainer.interval, steps_per_epoch - done)
        cb.on_train_batch_begin(done)
        rec = trainer.run_round(steps=m)
        done += rec["steps"]
        for name, value in {"loss": rec["loss"], **rec["metrics"]}.items():
            sums[name] = sums.get(name, 0.0) + value * rec["steps"]
        logs = {name: total / done for name, total in sums.items()}
        cb.on_train_batch_end(done - 1, logs)
        if model.stop_training:
            break
    return logs


def fit(
    model: Any,
    x: Any = None,
    y: Any = None,
    batch_size: Optional[int] = None,
    epochs: int = 1,
    verbose: Any = "auto",
    callbacks: Optional[List[Any]] = None,
    *,
    shuffle: bool = True,
    initial_epoch: int = 0,
    steps_per_epoch: Optional[int] = None,
    validation_data: Any = None,
    validation_batch_size: Optional[int] = None,
    validation_freq: int = 1,
    trainer: Optional[ParameterServerSkipCorrect] = None,
    seed: int = 0,
    **unsupported: Any,
) -> Any:
    """``model.fit`` through skip-and-correct rounds on this parameter-server cluster (chief). Returns a History.

    ``model`` must be built (and compiled, with a tf-keras optimizer of ``rules.SUPPORTED_OPTIMIZERS``) in
    the ``scope()`` of a ParameterServerSkipCorrect (``trainer``; default: the one whose strategy built
    the model). ``batch_size`` is the global batch (split over the shards). ``validation_data=(x, y)``:
    evaluated at the end of every ``validation_freq``-th epoch on :func:`chief_copy` (the global model),
    logged as ``val_loss`` and ``val_<metric>``. Arguments of tf-keras ``fit`` not listed here
    (sample_weight, class_weight, validation_split, ...) are a one-line InputError naming them; the
    arguments after ``callbacks`` are keyword-only.

    Example:
        >>> history = fit(model, x, y, batch_size=64, epochs=2)                    # doctest: +SKIP
        >>> history = fit(model, dataset_fn, epochs=2, steps_per_epoch=100)        # doctest: +SKIP
    """
    import tf_keras

    trainer, cbs = _check_fit_args(
        model, trainer, epochs, initial_epoch, callbacks, validation_data, validation_freq, unsupported
    )
    trainer, steps_per_epoch = prepare(model, x, y, batch_size, shuffle, steps_per_epoch, trainer, seed)
    verbose = 1 if verbose == "auto" else verbose
    cb = tf_keras.callbacks.CallbackList(
        cbs,
        add_history=True,
        add_progbar=verbose != 0,
        model=model,
        verbose=verbose,
        epochs=epochs,
        steps=steps_per_epoch,
    )
    model.stop_training = False
    cb.on_train_begin()
    logs: Dict[str, Any] = {}
    copies: List[Any] = []
    for epoch in range(initial_epoch, epochs):
        cb.on_epoch_begin(epoch)
        logs = _run_epoch(trainer, cb, model, steps_per_epoch)
        if validation_data is not None and (epoch + 1) % validation_freq == 0:
            copies[:] = [chief_copy(model, copies[0] if copies else None)]
            val = copies[0].evaluate(
                validation_data[0],
                validation_data[1],
                verbose=0,
                return_dict=True,
                batch_size=validation_batch_size or batch_size or 32,
            )
            logs.update({f"val_{k}": float(v) for k, v in val.items()})
        cb.on_epoch_end(epoch, dict(logs))
        if model.stop_training:
            break
    model.optimizer.iterations.assign(trainer.steps_done)  # the global step, as after a tf-keras fit
    cb.on_train_end(dict(logs))
    return model.history


def chief_copy(model: Any, copy: Optional[Any] = None) -> Any:
    """A copy of ``model`` on the chief, outside every strategy, with the current global weights read from the
    ps and the model's loss and metrics (fresh metric objects); pass ``copy`` (an earlier result) to refresh
    its weights only. What the wrapped ``evaluate`` / ``predict`` run on (tf-keras's own evaluate under a
    ParameterServerStrategy wants a DatasetCreator with ``steps``).

    Example:
        >>> plain = chief_copy(model); plain.evaluate(x_test, y_test)      # doctest: +SKIP
    """
    import tf_keras

    if copy is None:
        if tf.distribute.has_strategy():
            raise InputError(
                "evaluate / predict / chief_copy run on a copy on the chief: call them outside the "
                "strategy's scope()",
                where="model",
            )
        try:
            copy = tf_keras.models.clone_model(model)
        except Exception as e:  # pylint: disable=broad-except  (subclassed models cannot be cloned)
            first = " ".join(str(e).split())[:200]
            raise InputError(
                f"cannot copy this model to the chief for evaluate/predict ({type(e).__name__}: "
                f"{first}); build the same model outside the scope and set_weights(model.get_weights())",
                where="model",
            ) from None
        metrics = [
            type(m).from_config(m.get_config()) if isinstance(m, tf_keras.metrics.Metric) else m
            for m in _compat.keras_compiled_metrics(model)
        ]
        loss = getattr(model, "loss", None)
        if loss is not None:
            copy.compile(loss=loss, metrics=metrics)
    copy.set_weights(model.get_weights())
    return copy


def wrap(model: Any, trainer: Optional[ParameterServerSkipCorrect] = None) -> Any:
    """Make this one model instance's ``fit`` run :func:`fit`, and its ``evaluate`` / ``predict`` run on
    :func:`chief_copy` (no class is modified).

    Example:
        >>> model = wrap(model)                                      # doctest: +SKIP
        >>> model.fit(x, y, batch_size=64, epochs=3)                 # doctest: +SKIP

    The wrapper is an instance attribute (as ``distribute/_keras_hooks.py`` binds its wrappers), so other
    models, and tf-keras's ``Model`` class, keep tf-keras's own ``fit``.
    """
    import tf_keras

    if not isinstance(model, tf_keras.Model):
        raise InputError(
            f"must be a tf-keras model, got {type(model).__module__}.{type(model).__name__}", where="model"
        )
    trainer = _trainer_of(
        model, trainer
    )  # pinned now: a later trainer on the same strategy does not take over

    def ps_fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        return fit(self, *args, trainer=trainer, **kwargs)

    copies: List[Any] = []

    def on_chief(name: str) -> Callable:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            copy = chief_copy(self, copies[0] if copies else None)
            copies[:] = [copy]
            return getattr(copy, name)(*args, **kwargs)

        method.__doc__ = f"tf-keras ``{name}`` on :func:`chief_copy` (the global model, read from the ps)."
        return method

    ps_fit.__doc__ = fit.__doc__
    object.__setattr__(model, "fit", types.MethodType(ps_fit, model))
    for name in ("evaluate", "predict"):
        object.__setattr__(model, name, types.MethodType(on_chief(name), model))
    return model
