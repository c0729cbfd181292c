"""The tf-keras touch points of SkipCorrectStrategy, installed once and inert for other strategies.

1. ``apply_gradients`` of tf-keras optimizers (the current ``Optimizer`` and the legacy
   ``OptimizerV2``): called in a replica context of a SkipCorrectStrategy, it is routed to the
   strategy's extended (local step with correction, then maybe a sync) instead of all-reducing the
   gradients. Any other strategy gets the original method, unchanged.
2. ``Model.evaluate/predict/save/save_weights``: under a SkipCorrectStrategy they average the replicas
   first (``strategy.sync()``), so users always evaluate and save the global model.
3. Mixed precision (``mixed_float16``): tf-keras accepts loss scaling only under the strategy types it
   lists; SkipCorrectStrategy qualifies for the same reason Mirrored does (one variable copy per compute
   replica, so each replica unscales its own gradients once). ``LossScaleOptimizer.apply_gradients``
   would all-reduce the gradients every step (to skip non-finite steps on every replica together); under
   this strategy it only all-reduces one float per step (dynamic loss scale only): "does any replica
   have a non-finite gradient", and those steps are skipped on every replica.
4. ``tf.keras.callbacks.BackupAndRestore``: accepted (tf-keras lists the strategies it allows); every
   backup averages the replicas first, so the chief's checkpoint, from which every worker restores, holds
   the global model, t, k, H and every replica's Δ_i (each worker restores its own rows).
5. ``tf.keras.callbacks.TensorBoard`` needs the ``tensorboard`` package (a tf_commopt dependency; TensorFlow
   2.21 no longer installs it): without it the callback crashed at the end of epoch 1; under this
   strategy it now fails at train begin with a one-line InputError naming the package.
6. Keras 3: :func:`refuse_keras3` (called when the strategy creates a variable) raises a one-line
   InputError when the caller is Keras 3 (``keras.src``), whose optimizers bypass this strategy.

Example:
    >>> from tf_commopt.distribute import _keras_hooks
    >>> _keras_hooks.install(SkipCorrectStrategy)   # doctest: +SKIP  (SkipCorrectStrategy() does it)
"""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import tensorflow as tf

from tf_commopt import _compat
from tf_commopt.errors import InputError

__all__ = ["install", "refuse_keras3", "KERAS3_MESSAGE", "TENSORBOARD_MESSAGE"]

KERAS3_MESSAGE = ("a Keras 3 model or optimizer (the `keras` package) was built under this strategy; Keras 3 "
                  "all-reduces gradients itself, so nothing would be skipped. Use tf-keras: set "
                  "TF_USE_LEGACY_KERAS=1 before importing tensorflow (then tf.keras is tf-keras), or import "
                  "tf_keras instead of keras")


# the strategy class the hooks serve, registered by install() (so this module never imports skip_correct:
# no import cycle)
class _NotInstalled:  # matches nothing until install() registers the strategy class
    pass


_STRATEGY: list = [_NotInstalled]


def _is_sc(strategy: Any) -> bool:
    """Whether ``strategy`` is the registered SkipCorrectStrategy (False before install())."""
    return isinstance(strategy, _STRATEGY[0])


def _is_keras3_module(name: str) -> bool:
    return name == "keras" or name.startswith("keras.")


def refuse_keras3(max_frames: int = 80) -> None:
    """Raise a one-line InputError if the variable being created comes from Keras 3.

    Called by the strategy's variable creator (outside its own state); walks the caller frames
    (a Keras 3 layer or optimizer creates its variables from ``keras.src...``; tf-keras is ``tf_keras``).

    Example:
        >>> from tf_commopt.distribute._keras_hooks import refuse_keras3
        >>> refuse_keras3()   # called from plain code (or tf-keras): nothing happens
    """
    keras = sys.modules.get("keras")
    major = str(getattr(keras, "__version__", "3")).split(".")[0]
    if keras is None or not major.isdigit() or int(major) < 3:
        return  # Keras 3 was never imported (or `keras` is Keras 2): nothing to look for
    frame = sys._getframe(1)
    for _ in range(max_frames):
        if frame is None:
            return
        if _is_keras3_module(frame.f_globals.get("__name__", "")):
            err = InputError(KERAS3_MESSAGE, where="SkipCorrectStrategy")
            err.ag_pass_through = True  # type: ignore[attr-defined]
            raise err
        frame = frame.f_back

_INSTALLED = {"done": False}


def _wrap_apply(cls: Any, legacy: bool) -> None:
    original = cls.apply_gradients
    if getattr(original, "_tf_commopt_wrapped", False):
        return

    @tf.autograph.experimental.do_not_convert
    @functools.wraps(original)
    def apply_gradients(self, grads_and_vars, name=None, *args, **kwargs):
        if (_under_sc() and not tf.distribute.in_cross_replica_context() and not args
                and not getattr(self, "_mesh", None)):
            extended = tf.distribute.get_strategy().extended
            return extended._sc_apply(self, original, grads_and_vars, name, legacy)
        return original(self, grads_and_vars, name, *args, **kwargs)

    apply_gradients._tf_commopt_wrapped = True  # type: ignore[attr-defined]
    cls.apply_gradients = apply_gradients


def _wrap_sync_first(cls: Any, method: str, model_of: Callable[[Any], Any] = lambda self: self) -> None:
    """``cls.method`` averages the replicas first when ``model_of(self)`` runs under the strategy."""
    original: Callable = getattr(cls, method)
    if getattr(original, "_tf_commopt_wrapped", False):
        return

    @functools.wraps(original)
    def wrapped(self, *args, **kwargs):
        strategy = getattr(model_of(self), "_distribution_strategy", None)
        if _is_sc(strategy) and tf.executing_eagerly():
            strategy.sync()
        return original(self, *args, **kwargs)

    wrapped._tf_commopt_wrapped = True  # type: ignore[attr-defined]
    setattr(cls, method, wrapped)


def _under_sc() -> bool:
    return tf.distribute.has_strategy() and _is_sc(tf.distribute.get_strategy())


def _accept_loss_scaling(lso_module: Any) -> None:
    original = lso_module.strategy_supports_loss_scaling
    if getattr(original, "_tf_commopt_wrapped", False):
        return

    @functools.wraps(original)
    def strategy_supports_loss_scaling() -> bool:
        return _under_sc() or original()

    strategy_supports_loss_scaling._tf_commopt_wrapped = True  # type: ignore[attr-defined]
    lso_module.strategy_supports_loss_scaling = strategy_supports_loss_scaling


def _wrap_loss_scale_apply(cls: Any, legacy: bool) -> None:
    """Under SkipCorrectStrategy: no gradient all-reduce; non-finite steps are skipped everywhere."""
    original = cls.apply_gradients
    if getattr(original, "_tf_commopt_wrapped", False):
        return

    @tf.autograph.experimental.do_not_convert
    @functools.wraps(original)
    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        if not _under_sc() or tf.distribute.in_cross_replica_context():
            return original(self, grads_and_vars, *args, **kwargs)
        pairs = list(grads_and_vars)
        if self.dynamic:
            live = [tf.convert_to_tensor(g) for g, _ in pairs if g is not None]
            ok = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in live]) if live else tf.constant(True)
            bad = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, 1.0 - tf.cast(ok, tf.float32))
            poison = tf.where(bad > 0, tf.constant(float("nan")), tf.constant(1.0))
            pairs = [(None if g is None else tf.convert_to_tensor(g) * tf.cast(poison, g.dtype), v) for g, v in pairs]
        if legacy:
            kwargs["experimental_aggregate_gradients"] = False
        else:
            kwargs.pop("experimental_aggregate_gradients", None)
            kwargs["skip_gradients_aggregation"] = True
        return original(self, pairs, *args, **kwargs)

    apply_gradients._tf_commopt_wrapped = True  # type: ignore[attr-defined]
    cls.apply_gradients = apply_gradients


def _accept_backup_and_restore(callback_cls: Any, state_cls: Any) -> None:
    begin = callback_cls.on_train_begin
    if not getattr(begin, "_tf_commopt_wrapped", False):
        @functools.wraps(begin)
        def on_train_begin(self, logs=None):
            SkipCorrectStrategy = _STRATEGY[0]
            strategy = getattr(self.model, "_distribution_strategy", None)
            if _is_sc(strategy):
                supported = getattr(self, "_supported_strategies", None)
                if not isinstance(supported, tuple):
                    raise InputError("this tf-keras BackupAndRestore has no _supported_strategies tuple; "
                                     "tf_commopt supports tf-keras " + ", ".join(_compat.SUPPORTED_TF),
                                     where="BackupAndRestore")
                if SkipCorrectStrategy not in supported:
                    self._supported_strategies = supported + (SkipCorrectStrategy,)
            return begin(self, logs)

        on_train_begin._tf_commopt_wrapped = True  # type: ignore[attr-defined]
        callback_cls.on_train_begin = on_train_begin

    # the chief's checkpoint, which every worker restores, is the global model
    _wrap_sync_first(state_cls, "back_up", model_of=lambda state: state._model)


TENSORBOARD_MESSAGE = ("tf.keras.callbacks.TensorBoard needs the tensorboard package, which TensorFlow 2.21 does "
                       "not install: pip install tensorboard (a dependency of tf_commopt: pip install tf_commopt "
                       "installs it), or use tf_commopt.keras.SkipCorrectTelemetry(log_dir=...), which does not")


def _tensorboard_installed() -> bool:
    try:
        import tensorboard.summary  # noqa: F401
    except ImportError:
        return False
    return True


def _check_tensorboard(callback_cls: Any) -> None:
    begin = callback_cls.on_train_begin
    if getattr(begin, "_tf_commopt_wrapped", False):
        return

    @functools.wraps(begin)
    def on_train_begin(self, logs=None):
        if _is_sc(getattr(self.model, "_distribution_strategy", None)) and not _tensorboard_installed():
            raise InputError(TENSORBOARD_MESSAGE, where="TensorBoard")
        return begin(self, logs)

    on_train_begin._tf_commopt_wrapped = True  # type: ignore[attr-defined]
    callback_cls.on_train_begin = on_train_begin


def install(strategy_class: Any) -> None:
    """Install the hooks for ``strategy_class`` (SkipCorrectStrategy calls this; idempotent). A no-op when
    tf-keras is not importable."""
    _STRATEGY[0] = strategy_class
    if _INSTALLED["done"]:
        return
    tk = _compat.tf_keras_internals()
    if tk is None:
        return
    _wrap_apply(tk.optimizer.Optimizer, legacy=False)
    _wrap_apply(tk.optimizer_v2.OptimizerV2, legacy=True)
    for m in ("evaluate", "predict", "save", "save_weights"):
        _wrap_sync_first(tk.training.Model, m)
    _accept_loss_scaling(tk.loss_scale_optimizer)
    _wrap_loss_scale_apply(tk.loss_scale_optimizer.LossScaleOptimizerV3, legacy=False)
    _wrap_loss_scale_apply(tk.loss_scale_optimizer.LossScaleOptimizer, legacy=True)
    _accept_backup_and_restore(tk.callbacks.BackupAndRestore, tk.worker_training_state.WorkerTrainingState)
    _check_tensorboard(tk.callbacks.TensorBoard)
    _INSTALLED["done"] = True
