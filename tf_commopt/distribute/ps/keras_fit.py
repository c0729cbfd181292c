"""``model.fit`` on a parameter-server cluster, with skip-and-correct rounds underneath.

Example (the same script on every task; see docs/parameter_server.md, "model.fit")::

    from tf_commopt.distribute import parameter_server as psc, ps_fit
    psc.serve_unless_chief()                                   # worker / ps tasks serve here
    trainer = psc.ParameterServerSkipCorrect(interval="auto")  # correction="auto": vrl for SGD, else gradient
    with trainer.scope():
        model = tf_keras.Sequential([...])
        model.compile(optimizer=tf_keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    ps_fit.wrap(model)                                         # this instance's fit runs rounds
    history = model.fit(x, y, batch_size=64, epochs=3)         # or model.fit(dataset_fn, steps_per_epoch=...)

What ``fit`` does: K shards (one per worker); an epoch of ``steps_per_epoch`` global steps is run as
rounds of H local steps (``ParameterServerSkipCorrect.run_round``; the last round of an epoch is cut
to the steps left, with no re-trace) with the model's compiled optimizer translated into a tensor
rule (``ps_rules.py``: SGD, Adam, RMSprop, Adagrad; constant lr or a LearningRateSchedule evaluated
on the global step) whose slots live on the ps, one per shard. Callbacks get ``on_train_begin``,
``on_epoch_begin/end``, ``on_train_batch_begin/end`` (once per round, with the index of the round's
last step) and ``on_train_end``; a Keras progress bar is printed (``verbose``); the returned
``History`` has the loss and the compiled metrics (each: the mean over the epoch's local steps and the
shards, computed on the shard's model before each local update, as tf-keras's training metrics).
Metrics are evaluated in the closure without state: strings (``"accuracy"`` and ``"crossentropy"``
resolved from the shapes as tf-keras does, ``"mae"``, ...), functions and mean-type Metric objects
(``SparseCategoricalAccuracy()``, ``MeanAbsoluteError()``, ...); stateful metrics (AUC, Precision, ...)
are left out with a warning (``model.evaluate`` after ``fit`` computes them). ``validation_data=(x, y)``
is evaluated on :func:`chief_copy` at epoch ends (``val_*`` logs). The arguments after ``callbacks`` are
keyword-only (tf-keras's positional order differs from here on).

Data: arrays ``x, y`` (``batch_size`` is the global batch, split over the K shards; shard i = rows
i, i + K, ...; ``shuffle=True`` permutes the rows once, with ``seed``, before sharding — not every
epoch), or a dataset function ``dataset_fn(input_context)`` (or a
``tf_keras.utils.experimental.DatasetCreator``), as ParameterServerStrategy users write it, with
``steps_per_epoch``. The function is called for each shard i with ``InputContext(num_input_pipelines=K,
input_pipeline_id=i, num_replicas_in_sync=K)`` (so ``get_per_replica_batch_size(global)`` is the
shard's batch) *inside* the closure, on whichever worker runs shard i; the closure skips the steps
shard i has done and takes the next m. So the batches of (shard i, step t) are fixed whoever runs
them, a closure re-run after a worker failure reads the same batches, and the dataset must be
infinite (``.repeat()``). The price: each round rebuilds the shard's dataset and ``skip``s the steps
already done, which reads them (measured: 1,000 skipped batches of 32 MNIST-sized rows 0.06–0.5 s,
10,000 1.4–2.3 s). A ``dataset_fn(input_context, step)`` (two parameters) is given the shard's step
(an int64 tensor) and returns the dataset from that step on, so nothing is skipped: e.g.
``tf.data.Dataset.range(step, 2**62).map(lambda t: batch_of_step(t))``.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from tf_commopt import use_tf_keras  # noqa: E402

use_tf_keras()
import tensorflow as tf  # noqa: E402

from tf_commopt import _compat  # noqa: E402
from tf_commopt.distribute.parameter_server import ParameterServerSkipCorrect, array_batch_fn, trainer_for  # noqa: E402
from tf_commopt.distribute.ps_rules import SUPPORTED_OPTIMIZERS, update_rule  # noqa: E402
from tf_commopt.errors import InputError  # noqa: E402

__all__ = ["fit", "wrap", "prepare", "chief_copy", "DatasetFnSource", "SUPPORTED_OPTIMIZERS", "update_rule"]

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


class DatasetFnSource:
    """Batches of shard i from ``dataset_fn(InputContext(K, i, K))``, built inside the closure.

    Example:
        >>> src = DatasetFnSource(lambda ctx: ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id), 2)  # doctest: +SKIP

    Step t of shard i is the dataset's element t (the closure ``skip``s the steps done), so the batches
    do not depend on which worker runs the shard. Elements must be ``(x, y)``; the dataset must not end.
    """

    per_shard = True  # one closure per shard: the InputContext holds a Python int

    def __init__(self, dataset_fn: Callable, num_shards: int) -> None:
        self.dataset_fn, self.num_shards = dataset_fn, int(num_shards)
        self.takes_step = _takes_step(dataset_fn)

    def open(self, shard: int, step0: Any) -> Callable:
        k = self.num_shards
        ctx = tf.distribute.InputContext(
            num_input_pipelines=k, input_pipeline_id=int(shard), num_replicas_in_sync=k
        )
        # dataset_fn(ctx, step): the user's dataset starts at the shard's step itself (O(1)); else skip
        ds = self.dataset_fn(ctx, step0) if self.takes_step else self.dataset_fn(ctx)
        if not isinstance(ds, tf.data.Dataset):
            raise InputError(f"dataset_fn must return a tf.data.Dataset, got {type(ds).__name__}", where="x")
        spec = ds.element_spec
        if not (isinstance(spec, tuple) and len(spec) == 2):
            raise InputError(f"dataset_fn's dataset must yield (x, y) pairs, got elements {spec}", where="x")
        it = iter(ds if self.takes_step else ds.skip(step0))

        def next_batch(j):
            opt = it.get_next_as_optional()
            ok = tf.debugging.Assert(
                opt.has_value(),
                [
                    f"dataset_fn's dataset of shard {shard} ended; make it infinite "
                    "with .repeat() (steps_per_epoch counts the steps)"
                ],
            )
            with tf.control_dependencies([ok]):
                bx, by = opt.get_value()
            return bx, by

        return next_batch


def _takes_step(fn: Callable) -> bool:
    """Whether ``fn`` is ``dataset_fn(input_context, step)`` (two positional parameters, no ``*args``)."""
    import inspect

    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return False  # e.g. a DatasetCreator(*args, **kwargs): the one-argument form
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2


def _loss_of(model: Any) -> Any:
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


def _by_shape(kind: str) -> Callable:
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


def _metric_fns(model: Any) -> List[Tuple[str, Callable]]:
    """The compiled metrics as ``(name, fn(y_true, y_pred))``; stateful ones (AUC, Precision, ...) are left out
    with a warning (they need variables that live through the epoch; a closure holds none)."""
    import tf_keras

    out, skipped = [], []
    for spec in _compat.keras_compiled_metrics(model):
        if isinstance(spec, str) and spec in ("accuracy", "acc", "crossentropy", "ce"):
            out.append((spec, _by_shape("accuracy" if spec in ("accuracy", "acc") else "crossentropy")))
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
    k = trainer.num_workers if not getattr(trainer, "_compiled", False) else trainer.num_shards
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
    loss = _loss_of(model)
    source, steps_per_epoch, key = _source(trainer, x, y, batch_size, shuffle, steps_per_epoch, seed)
    if not getattr(trainer, "_compiled", False):
        trainer.compile(
            model,
            loss=loss,
            batch_fn=source,
            num_shards=source.num_shards,
            optimizer=model.optimizer,
            metrics=_metric_fns(model),
        )
    elif trainer.model is not model:
        raise InputError(
            "this trainer trains another model; build a ParameterServerSkipCorrect per model", where="model"
        )
    elif getattr(trainer, "_fit_key", None) != key:
        trainer.set_data(source)
    trainer._fit_key = key  # pylint: disable=protected-access
    return trainer, steps_per_epoch


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

    Example:
        >>> history = fit(model, x, y, batch_size=64, epochs=2)                    # doctest: +SKIP
        >>> history = fit(model, dataset_fn, epochs=2, steps_per_epoch=100)        # doctest: +SKIP

    ``model`` must be built (and compiled, with a tf-keras optimizer of :data:`SUPPORTED_OPTIMIZERS`) in
    the ``scope()`` of a ParameterServerSkipCorrect (``trainer``; default: the one whose strategy built
    the model). ``batch_size`` is the global batch (split over the shards). ``validation_data=(x, y)``:
    evaluated at the end of every ``validation_freq``-th epoch on :func:`chief_copy` (the global model),
    logged as ``val_loss`` and ``val_<metric>``. Arguments of tf-keras ``fit`` not listed here
    (sample_weight, class_weight, validation_split, ...) are a one-line InputError naming them.
    """
    import tf_keras

    if unsupported:
        name = sorted(unsupported)[0]
        raise InputError(
            f"fit({name}=...) is not supported on the parameter-server path (supported: "
            f"{', '.join(_FIT_ARGS)})",
            where=name,
        )
    trainer = _trainer_of(model, trainer)
    for name, val, low in (("epochs", epochs, 1), ("initial_epoch", initial_epoch, 0)):
        if isinstance(val, bool) or not isinstance(val, int) or val < low:
            raise InputError(f"must be an integer >= {low}, got {val!r}", where=name)
    cbs = list(getattr(callbacks, "callbacks", callbacks) or [])
    for cb in cbs:
        if isinstance(cb, tf_keras.callbacks.BackupAndRestore):
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
    trainer, steps_per_epoch = prepare(model, x, y, batch_size, shuffle, steps_per_epoch, trainer, seed)
    copies: List[Any] = []

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
    for epoch in range(initial_epoch, epochs):
        cb.on_epoch_begin(epoch)
        done, sums = 0, {}
        while done < steps_per_epoch:
            m = min(trainer.interval, steps_per_epoch - done)  # the epoch's last round: the steps left
            cb.on_train_batch_begin(done)
            rec = trainer.run_round(steps=m)
            done += rec["steps"]
            for name, value in {
                "loss": rec["loss"],
                **rec["metrics"],
            }.items():  # running means over the epoch
                sums[name] = sums.get(name, 0.0) + value * rec["steps"]
            logs = {name: total / done for name, total in sums.items()}
            cb.on_train_batch_end(done - 1, logs)
            if model.stop_training:
                break
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
