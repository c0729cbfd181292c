"""Where tf-keras optimizers and models reach SkipCorrectStrategy: per instance, never class-wide.

Every tf-keras optimizer and model whose variables are created under a SkipCorrectStrategy's scope is
*adopted*: the strategy's variable creator calls :func:`adopt_callers`, which finds the optimizer / model
instances on the Python call stack (their ``__init__``, ``build``, ``compile`` or first call created the
variable) and binds wrappers on those instances (instance attributes, as Horovod's DistributedOptimizer
wraps one optimizer). tf-keras calls them through the instance (``Model.train_step`` →
``self.optimizer.minimize`` → ``self.apply_gradients``; callbacks call ``self.model.save_weights``), so
the instance attribute is what runs. tf-keras classes are left untouched: a model or optimizer built
outside every SkipCorrectStrategy scope is stock tf-keras (``tests/tf/test_keras_stock.py``).

1. ``apply_gradients`` of an adopted optimizer (current ``Optimizer`` and legacy ``OptimizerV2``):
   called in a replica context of a SkipCorrectStrategy, it is routed to the strategy's extended (local
   step with correction, then maybe a sync) instead of all-reducing the gradients. Its gradient
   aggregation (``aggregate_gradients`` / legacy ``_aggregate_gradients``, which a LossScaleOptimizer
   calls on its inner optimizer) is the identity there. Under any other strategy: the original method.
2. ``evaluate/predict/save/save_weights`` of an adopted model: under a SkipCorrectStrategy they average
   the replicas first (``strategy.sync()``), so users always evaluate and save the global model.
3. Mixed precision (``mixed_float16``): tf-keras accepts loss scaling only under the strategy types it
   lists; SkipCorrectStrategy qualifies for the same reason Mirrored does (one variable copy per compute
   replica, so each replica unscales its own gradients once). This check is a module function of
   tf-keras called from ``LossScaleOptimizer.__init__`` before any instance exists, so it is the one
   process-wide hook left (installed when the first SkipCorrectStrategy is built; it returns tf-keras's
   own answer unless the current strategy is a SkipCorrectStrategy). An adopted
   ``LossScaleOptimizer.apply_gradients`` would all-reduce the gradients every step (to skip non-finite
   steps on every replica together); under this strategy it only all-reduces one float per step (dynamic
   loss scale only): "does any replica have a non-finite gradient", and those steps are skipped on every
   replica.
4. ``fit`` of an adopted model, for the callbacks passed to it: a ``tf.keras.callbacks.BackupAndRestore``
   accepts the strategy (tf-keras lists the strategies it allows, per callback instance) and each of its
   backups averages the replicas first, so the chief's checkpoint, from which every worker restores,
   holds the global model, t, k, H and every replica's Δ_i (each worker restores its own rows);
   ``tf.keras.callbacks.TensorBoard`` needs the ``tensorboard`` package (a tf_commopt dependency that
   TensorFlow 2.21 does not install): without it, ``fit`` under this strategy fails before training with
   a one-line InputError naming the package. With
   ``overlap=True`` the end of ``fit`` (``on_train_end`` of a callback appended to its list) applies the
   averaging still in flight (``extended.drain()``).
5. Keras 3: :func:`refuse_keras3` (called when the strategy creates a variable) raises a one-line
   InputError when the caller is Keras 3 (``keras.src``), whose optimizers bypass this strategy.

Example:
    >>> from tf_commopt.distribute import _keras_hooks
    >>> _keras_hooks.install(SkipCorrectStrategy)   # doctest: +SKIP  (SkipCorrectStrategy() does it)
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
from typing import Any, Callable

import tensorflow as tf

from tf_commopt import _compat
from tf_commopt.distribute import keras_fit
from tf_commopt.errors import InputError

__all__ = ["install", "adopt_callers", "refuse_keras3", "KERAS3_MESSAGE", "TENSORBOARD_MESSAGE"]

KERAS3_MESSAGE = (
    "a Keras 3 model or optimizer (the `keras` package) was built under this strategy; Keras 3 "
    "all-reduces gradients itself, so nothing would be skipped. Use tf-keras: set "
    "TF_USE_LEGACY_KERAS=1 before importing tensorflow (then tf.keras is tf-keras), or import "
    "tf_keras instead of keras"
)


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
_ADOPTED = "_tf_commopt_adopted"  # instance attribute marking an adopted optimizer / model


def _under_sc() -> bool:
    return tf.distribute.has_strategy() and _is_sc(tf.distribute.get_strategy())


def _bind(obj: Any, name: str, wrapper: Callable) -> None:
    """``obj.name = wrapper`` bound to ``obj``, as a plain instance attribute (no tracking, no class change)."""
    object.__setattr__(obj, name, types.MethodType(wrapper, obj))


# ---- optimizers -----------------------------------------------------------------------------------------
_MIDCALL = "_tf_commopt_midcall"  # adopted inside its own first (class) apply_gradients call


def _adopt_optimizer(opt: Any, tk: Any, midcall: bool = False) -> None:
    if opt.__dict__.get(_ADOPTED):
        return
    object.__setattr__(opt, _ADOPTED, True)
    if isinstance(opt, tk.loss_scale_optimizer.BaseLossScaleOptimizer):
        _wrap_loss_scale_apply(opt, legacy=not isinstance(opt, tk.optimizer.Optimizer))
        inner = getattr(opt, "inner_optimizer", None)
        if inner is not None:
            _adopt_optimizer(inner, tk)
        return
    legacy = not isinstance(opt, tk.optimizer.Optimizer)
    original_apply = type(opt).apply_gradients

    @tf.autograph.experimental.do_not_convert
    @functools.wraps(original_apply)
    def apply_gradients(self, grads_and_vars, name=None, *args, **kwargs):
        if (
            _under_sc()
            and not tf.distribute.in_cross_replica_context()
            and not args
            and not _compat.optimizer_mesh(self)
            and not self.__dict__.get(_MIDCALL)
        ):
            extended = tf.distribute.get_strategy().extended
            return extended._sc_apply(self, original_apply, grads_and_vars, name, legacy)
        return original_apply(self, grads_and_vars, name, *args, **kwargs)

    _bind(opt, "apply_gradients", apply_gradients)

    # a LossScaleOptimizer aggregates its inner optimizer's gradients itself before calling its
    # apply_gradients: under the strategy that aggregation is the identity (each replica keeps its own)
    agg_name = "_aggregate_gradients" if legacy else "aggregate_gradients"
    original_agg = getattr(type(opt), agg_name)

    @tf.autograph.experimental.do_not_convert
    @functools.wraps(original_agg)
    def aggregate_gradients(self, grads_and_vars, *args, **kwargs):
        if _under_sc() and not tf.distribute.in_cross_replica_context():
            pairs = list(grads_and_vars)
            if self.__dict__.get(_MIDCALL):  # the step's first half, see _finish_midcall below
                live = [(g, v) for g, v in pairs if g is not None]
                extended = tf.distribute.get_strategy().extended
                if not tf.executing_eagerly():
                    extended._sc_train_graphs.add(tf.compat.v1.get_default_graph())
                new = tf.distribute.get_replica_context().merge_call(
                    extended._sc_prepare_grads, args=(self, [v for _, v in live], [g for g, _ in live])
                )
                return list(zip(new, [v for _, v in live]))
            return pairs
        return original_agg(self, grads_and_vars, *args, **kwargs)

    _bind(opt, agg_name, aggregate_gradients)
    if midcall and legacy:
        _finish_midcall(opt)


def _finish_midcall(opt: Any) -> None:
    """A legacy optimizer created under the scope has no variable until its first ``apply_gradients``
    creates ``iterations``: it is adopted inside that call, which goes on in the class method. That first
    call is made the strategy's step in two halves: its ``_aggregate_gradients`` (replica context)
    computes the local step's gradients (R·g_i − Δ_i, or the warm-up all-reduce), and its
    ``_distributed_apply`` (cross-replica) counts the step and maybe syncs after applying them. The other
    replicas' threads enter ``apply_gradients`` after the adoption; they take the same class path until
    that first step is done. Every later call goes through the bound ``apply_gradients``."""
    object.__setattr__(opt, _MIDCALL, True)
    original = type(opt)._distributed_apply

    @tf.autograph.experimental.do_not_convert
    @functools.wraps(original)
    def _distributed_apply(self, distribution, grads_and_vars, *args, **kwargs):
        out = original(self, distribution, grads_and_vars, *args, **kwargs)
        if self.__dict__.pop(_MIDCALL, False) and _is_sc(distribution):
            distribution.extended._sc_after_step(
                distribution, self, [v for g, v in grads_and_vars if g is not None]
            )
        return out

    _bind(opt, "_distributed_apply", _distributed_apply)


def _wrap_loss_scale_apply(opt: Any, legacy: bool) -> None:
    """Under SkipCorrectStrategy: no gradient all-reduce; non-finite steps are skipped everywhere."""
    original = type(opt).apply_gradients

    @tf.autograph.experimental.do_not_convert
    @functools.wraps(original)
    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        if not _under_sc() or tf.distribute.in_cross_replica_context():
            return original(self, grads_and_vars, *args, **kwargs)
        pairs = list(grads_and_vars)
        if self.dynamic:
            live = [tf.convert_to_tensor(g) for g, _ in pairs if g is not None]
            ok = (
                tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in live])
                if live
                else tf.constant(True)
            )
            bad = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, 1.0 - tf.cast(ok, tf.float32)
            )
            poison = tf.where(bad > 0, tf.constant(float("nan")), tf.constant(1.0))
            pairs = [
                (None if g is None else tf.convert_to_tensor(g) * tf.cast(poison, g.dtype), v)
                for g, v in pairs
            ]
        if legacy:
            kwargs["experimental_aggregate_gradients"] = False
        else:
            kwargs.pop("experimental_aggregate_gradients", None)
            kwargs["skip_gradients_aggregation"] = True
        return original(self, pairs, *args, **kwargs)

    _bind(opt, "apply_gradients", apply_gradients)


# ---- models ---------------------------------------------------------------------------------------------
def _sync_first(original: Callable, model_of: Callable[[Any], Any] = lambda self: self) -> Callable:
    """``original`` (a function of self), averaging the replicas first when ``model_of(self)`` runs under
    the strategy."""

    @functools.wraps(original)
    def wrapped(self, *args, **kwargs):
        strategy = _compat.keras_model_strategy(model_of(self))
        if _is_sc(strategy) and tf.executing_eagerly():
            strategy.sync()
        return original(self, *args, **kwargs)

    return wrapped


def _adopt_model(model: Any, tk: Any) -> None:
    if model.__dict__.get(_ADOPTED):
        return
    object.__setattr__(model, _ADOPTED, True)
    cls = type(model)
    for m in ("evaluate", "predict", "save", "save_weights"):
        _bind(model, m, _sync_first(getattr(cls, m)))
    original_fit = cls.fit
    fit_signature = inspect.signature(original_fit)

    @functools.wraps(original_fit)
    def fit(self, *args, **kwargs):
        strategy = _compat.keras_model_strategy(self)
        if _is_sc(strategy):
            try:
                callbacks = fit_signature.bind(self, *args, **kwargs).arguments.get("callbacks")
            except TypeError:  # let tf-keras report a bad call
                callbacks = None
            callbacks = getattr(callbacks, "callbacks", callbacks) or []  # a CallbackList or a list
            for cb in callbacks:
                if isinstance(cb, tk.callbacks.BackupAndRestore):
                    _accept_backup_and_restore(cb)
                elif isinstance(cb, tk.callbacks.TensorBoard) and not _tensorboard_installed():
                    raise InputError(TENSORBOARD_MESSAGE, where="TensorBoard")
            return keras_fit.fit(self, strategy, original_fit, fit_signature, args, kwargs, tk)
        return original_fit(self, *args, **kwargs)

    _bind(model, "fit", fit)
    optimizer = getattr(model, "optimizer", None)  # compile under the scope: the model's optimizer too
    if isinstance(optimizer, (tk.optimizer.Optimizer, tk.optimizer_v2.OptimizerV2)):
        _adopt_optimizer(optimizer, tk)


def _accept_backup_and_restore(callback: Any) -> None:
    """This BackupAndRestore instance accepts the strategy, and its backups average the replicas first."""
    SkipCorrectStrategy = _STRATEGY[0]
    supported = _compat.backup_supported_strategies(callback)
    if SkipCorrectStrategy not in supported:
        _compat.set_backup_supported_strategies(callback, supported + (SkipCorrectStrategy,))
    if callback.__dict__.get(_ADOPTED):
        return
    object.__setattr__(callback, _ADOPTED, True)
    original_begin = type(callback).on_train_begin

    @functools.wraps(original_begin)
    def on_train_begin(self, logs=None):
        out = original_begin(self, logs)
        state = _compat.backup_training_state(self)  # created by on_train_begin
        # the chief's checkpoint, which every worker restores, is the global model
        _bind(state, "back_up", _sync_first(type(state).back_up, model_of=_compat.training_state_model))
        return out

    _bind(callback, "on_train_begin", on_train_begin)


TENSORBOARD_MESSAGE = (
    "tf.keras.callbacks.TensorBoard needs the tensorboard package, which TensorFlow 2.21 does "
    "not install: pip install tensorboard (a dependency of tf_commopt: pip install tf_commopt "
    "installs it), or use tf_commopt.keras.SkipCorrectTelemetry(log_dir=...), which does not"
)


def _tensorboard_installed() -> bool:
    try:
        import tensorboard.summary  # noqa: F401
    except ImportError:
        return False
    return True


# ---- finding the instances -----------------------------------------------------------------------------
def adopt_callers(max_frames: int = 400) -> None:
    """Adopt the tf-keras optimizers and models on the call stack (the strategy's variable creator calls
    this for every variable it creates for the user: whoever creates a variable under the scope is built
    under the scope). Cheap when tf-keras was never imported.

    Example:
        >>> from tf_commopt.distribute._keras_hooks import adopt_callers
        >>> adopt_callers()   # from plain code: nothing to adopt
    """
    if "tf_keras" not in sys.modules:
        return
    tk = _compat.tf_keras_internals()
    if tk is None:
        return
    opt_types = (tk.optimizer.Optimizer, tk.optimizer_v2.OptimizerV2)
    frame = sys._getframe(1)
    found: dict = {}  # id -> [object, inside its own class apply_gradients]
    for _ in range(max_frames):
        if frame is None:
            break
        code = frame.f_code
        if code.co_argcount and code.co_varnames[0] == "self":
            obj = frame.f_locals.get("self")
            if isinstance(obj, opt_types) or isinstance(obj, tk.training.Model):
                entry = found.setdefault(id(obj), [obj, False])
                if code.co_name == "apply_gradients" and frame.f_globals.get("__name__") != __name__:
                    entry[1] = True
        frame = frame.f_back
    for obj, midcall in found.values():
        if isinstance(obj, opt_types):
            _adopt_optimizer(obj, tk, midcall=midcall)
        else:
            _adopt_model(obj, tk)


def _accept_loss_scaling(lso_module: Any) -> None:
    original = lso_module.strategy_supports_loss_scaling
    if getattr(original, "_tf_commopt_wrapped", False):
        return

    @functools.wraps(original)
    def strategy_supports_loss_scaling() -> bool:
        return _under_sc() or original()

    strategy_supports_loss_scaling._tf_commopt_wrapped = True  # type: ignore[attr-defined]
    lso_module.strategy_supports_loss_scaling = strategy_supports_loss_scaling


def install(strategy_class: Any) -> None:
    """Register ``strategy_class`` and install the one process-wide hook, tf-keras's loss-scaling strategy
    check (SkipCorrectStrategy calls this; idempotent; a no-op when tf-keras is not importable). Everything
    else is bound per instance by :func:`adopt_callers`."""
    _STRATEGY[0] = strategy_class
    if _INSTALLED["done"]:
        return
    tk = _compat.tf_keras_internals()
    if tk is None:
        return
    _accept_loss_scaling(tk.loss_scale_optimizer)
    _INSTALLED["done"] = True
