"""tf-keras internals: the private modules the Keras hooks use, optimizer and model attributes, and the
functional-graph readers (tf-keras; Keras 3 where it differs).

tf-keras is imported on first use, not here: importing tf_commopt must not import tf-keras (the
strategy's constructor checks whether the user's tf.keras is tf-keras, partly by looking for it in
``sys.modules``).

Example:
    >>> from tf_commopt._compat import optimizer_lr   # doctest: +SKIP
    >>> float(optimizer_lr(tf_keras.optimizers.SGD(0.1)))   # doctest: +SKIP
    0.1
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf

from tf_commopt._compat._gate import _LOADERS, INTERNALS, SUPPORTED_TF, _SetBy, values
from tf_commopt.errors import TfCommoptError

# ---- private tf-keras modules (tf_keras.src.*), used by tf_commopt/distribute/_keras_hooks.py -------
# imported on first use, not here: importing tf_commopt must not import tf-keras (the strategy's
# constructor checks whether the user's tf.keras is tf-keras, partly by looking for it in sys.modules)
_TF_KERAS: List[Any] = []


def tf_keras_internals() -> Any:
    """The tf-keras private modules the Keras hooks and graph readers use, or None without tf-keras.

    The first call also adds what the hooks rely on to :data:`INTERNALS`.

    >>> tk = tf_keras_internals()   # doctest: +SKIP
    >>> tk.loss_scale_optimizer.LossScaleOptimizerV3   # doctest: +SKIP
    """
    if _TF_KERAS:
        return _TF_KERAS[0]
    try:
        from tf_keras.src import callbacks
        from tf_keras.src.distribute import worker_training_state
        from tf_keras.src.engine import base_layer, compile_utils, functional, node, training
        from tf_keras.src.metrics import base_metric
        from tf_keras.src.mixed_precision import loss_scale_optimizer
        from tf_keras.src.optimizers import optimizer
        from tf_keras.src.optimizers.legacy import optimizer_v2
    except ImportError:
        return None
    import types

    tk = types.SimpleNamespace(
        callbacks=callbacks,
        worker_training_state=worker_training_state,
        training=training,
        loss_scale_optimizer=loss_scale_optimizer,
        functional=functional,
        node=node,
        base_layer=base_layer,
        compile_utils=compile_utils,
        base_metric=base_metric,
        optimizer=optimizer,
        optimizer_v2=optimizer_v2,
    )
    INTERNALS[0:0] = [  # at the front: callers may append/pop their own entries at the end
        (tk.loss_scale_optimizer, "strategy_supports_loss_scaling"),  # the one module-level hook
        (tk.loss_scale_optimizer, "LossScaleOptimizer"),
        (tk.loss_scale_optimizer, "LossScaleOptimizerV3"),
        (tk.loss_scale_optimizer, "BaseLossScaleOptimizer"),
        (tk.loss_scale_optimizer, "_DynamicLossScaleState"),
        # wrapped per instance (distribute/_keras_hooks.py); tf-keras must call them through the instance
        (
            tk.callbacks.BackupAndRestore,
            "on_train_begin",
        ),  # it reads self._supported_strategies (set in __init__)
        (tk.worker_training_state.WorkerTrainingState, "back_up"),
        (tk.callbacks.TensorBoard, "on_train_begin"),
        (tk.optimizer.Optimizer, "apply_gradients"),
        (tk.optimizer_v2.OptimizerV2, "apply_gradients"),
        (tk.optimizer.Optimizer, "aggregate_gradients"),
        (tk.optimizer_v2.OptimizerV2, "_aggregate_gradients"),
        (tk.optimizer_v2.OptimizerV2, "_distributed_apply"),
        (tk.training.Model, "save_weights"),
        (tk.training.Model, "fit"),
        (_SetBy(tk.training.Model.__init__), "_distribution_strategy"),
        (_SetBy(tk.callbacks.BackupAndRestore.__init__), "_supported_strategies"),
        # the functional-graph readers below (keras_layer_graph, keras_nodes_by_depth, ...)
        (_SetBy(tk.functional.Functional._init_graph_network), "_nodes_by_depth"),
        (_SetBy(tk.functional.Functional._init_graph_network), "_nested_outputs"),
        (_SetBy(tk.node.Node.__init__), "_keras_history"),
        (tk.base_layer.Layer, "_inbound_nodes"),
        (tk.base_layer.Layer, "_flatten_layers"),  # keras_all_layers
        # read by the wrappers of distribute/_keras_hooks.py
        (_SetBy(tk.optimizer.Optimizer.__init__), "_mesh"),
        (_SetBy(tk.optimizer._BaseOptimizer.learning_rate.fset), "_learning_rate"),  # optimizer_schedule
        (_SetBy(tk.compile_utils.MetricsContainer.__init__), "_user_metrics"),  # keras_compiled_metrics
        (_SetBy(tk.base_metric.MeanMetricWrapper.__init__), "_fn"),  # keras_mean_metric_fn
        (_SetBy(tk.base_metric.MeanMetricWrapper.__init__), "_fn_kwargs"),
        (_SetBy(tk.callbacks.BackupAndRestore.on_train_begin), "_training_state"),
        (_SetBy(tk.worker_training_state.WorkerTrainingState.__init__), "_model"),
        # fit_starting_at: fit asks Model._training_state where to start (BackupAndRestore's resume hook)
        (tk.training.Model, "_maybe_load_initial_counters_from_ckpt"),
        (_SetBy(tk.training.Model.__init__), "_training_state"),
        # refresh_checkpoint_children: the optimizer's cached checkpoint children
        (_SetBy(tk.optimizer._BaseOptimizer._trackable_children), "_coalesced_children"),
    ]
    _TF_KERAS.append(tk)
    return tk


# ---- tf-keras optimizer internals (current and legacy optimizers) ---------------------------------------
def optimizer_lr(optimizer: Any) -> tf.Tensor:
    """The current learning rate of a tf-keras optimizer (schedules and legacy optimizers included), float32."""
    if hasattr(optimizer, "_decayed_lr"):  # legacy OptimizerV2
        return optimizer._decayed_lr(tf.float32)
    return tf.cast(tf.convert_to_tensor(optimizer.learning_rate), tf.float32)


def optimizer_schedule(optimizer: Any) -> Optional[Any]:
    """The LearningRateSchedule object of a current tf-keras optimizer (``_learning_rate``), or None when its
    learning rate is a constant (parameter-server update rules, ``distribute/ps/rules.py``)."""
    tf_keras_internals()  # lists _learning_rate in INTERNALS
    from tf_keras.optimizers.schedules import LearningRateSchedule

    lr = getattr(optimizer, "_learning_rate", None)
    return lr if isinstance(lr, LearningRateSchedule) else None


def keras_compiled_metrics(model: Any) -> List[Any]:
    """The metrics passed to a tf-keras ``model.compile(metrics=...)``, flattened (strings, functions, Metric
    objects; ``compiled_metrics._user_metrics``)."""
    tf_keras_internals()
    container = getattr(model, "compiled_metrics", None)
    user = getattr(container, "_user_metrics", None) if container is not None else None
    return [m for m in tf.nest.flatten(user) if m is not None] if user is not None else []


def keras_mean_metric_fn(metric: Any) -> Optional[Any]:
    """``fn(y_true, y_pred)`` (per-example values) of a tf-keras ``MeanMetricWrapper`` (Accuracy, MAE, ...:
    ``_fn`` with ``_fn_kwargs``), or None for any other (stateful) metric."""
    tk = tf_keras_internals()
    if not isinstance(metric, tk.base_metric.MeanMetricWrapper):
        return None
    fn, kwargs = metric._fn, dict(metric._fn_kwargs)
    return lambda y_true, y_pred: fn(y_true, y_pred, **kwargs)


def keras_model_strategy(model: Any) -> Optional[Any]:
    """The strategy a tf-keras model was built under (``_distribution_strategy``; None outside every
    strategy's scope)."""
    return model._distribution_strategy


def optimizer_mesh(optimizer: Any) -> Optional[Any]:
    """The DTensor mesh of a current tf-keras optimizer (``_mesh``), None for a legacy optimizer or none."""
    return optimizer._mesh if isinstance(optimizer, tf_keras_internals().optimizer.Optimizer) else None


def backup_supported_strategies(callback: Any) -> Tuple[Any, ...]:
    """The strategy classes a tf-keras ``BackupAndRestore`` accepts (``_supported_strategies``)."""
    supported = callback._supported_strategies
    if not isinstance(supported, tuple):
        raise TfCommoptError(
            "tf-keras BackupAndRestore._supported_strategies is no longer a tuple; tf_commopt supports "
            "tf-keras " + ", ".join(SUPPORTED_TF)
        )
    return supported


def set_backup_supported_strategies(callback: Any, supported: Tuple[Any, ...]) -> None:
    """Set the strategy classes this one ``BackupAndRestore`` instance accepts."""
    callback._supported_strategies = tuple(supported)


def backup_training_state(callback: Any) -> Any:
    """The ``WorkerTrainingState`` a ``BackupAndRestore`` creates in ``on_train_begin``
    (``_training_state``; read it after that call)."""
    return callback._training_state


class _StartAt:
    """What ``Model.fit`` asks its ``_training_state`` for: the (epoch, step) to start training at."""

    def __init__(self, epoch: int, step: int) -> None:
        self.epoch, self.step = int(epoch), int(step)

    def maybe_load_initial_counters_from_ckpt(
        self, steps_per_epoch: int, initial_epoch: int, mode: Any = None
    ):
        if str(mode).lower().endswith("train") and self.step < steps_per_epoch:
            return self.epoch, self.step
        return initial_epoch, 0


def fit_starting_at(model: Any, epoch: int, step: int) -> Any:
    """Make the next ``model.fit`` start at batch ``step`` of epoch ``epoch`` (tf-keras's own mid-epoch
    resume: ``fit`` asks ``Model._training_state``, which ``BackupAndRestore`` sets, for its first epoch
    and step); returns a function that undoes it. The data set must start at that batch itself."""
    tf_keras_internals()  # lists _training_state in INTERNALS
    if getattr(model, "_training_state", None) is not None:
        raise TfCommoptError("the model already has a tf-keras training state (a BackupAndRestore in fit?)")
    model._training_state = _StartAt(epoch, step)

    def undo() -> None:
        model._training_state = None

    return undo


def refresh_checkpoint_children(obj: Any) -> None:
    """Make the next checkpoint of a tf-keras optimizer list its children afresh.

    A tf-keras optimizer caches its checkpoint children at its first checkpoint call
    (``_coalesced_children``). When that call is a restore before training (``load_weights``,
    ``BackupAndRestore``), children tracked later (the skip-and-correct state) are missing from every
    later save: a backup written after a resume would lose them. Anything else: nothing to do.
    """
    if "_coalesced_children" in vars(obj):
        tf_keras_internals()  # lists _coalesced_children in INTERNALS
        del obj._coalesced_children


def training_state_model(state: Any) -> Any:
    """The model a tf-keras ``WorkerTrainingState`` backs up (``_model``)."""
    return state._model


def optimizer_momentum(optimizer: Any) -> tf.Tensor:
    """Momentum β of a tf-keras SGD optimizer, heavy-ball or Nesterov (0 for other optimizers).

    Both move lr/(1 − β) per unit of a steady gradient (Nesterov: v ← βv − lr·g, x ← x + βv − lr·g),
    so both get the effective lr lr/(1 − β) in the vrl update."""
    if type(optimizer).__name__ != "SGD":
        return tf.constant(0.0, tf.float32)
    beta = getattr(optimizer, "momentum", None)
    if beta is None and hasattr(optimizer, "_get_hyper"):  # legacy OptimizerV2
        beta = optimizer._get_hyper("momentum")
    return tf.cast(tf.convert_to_tensor(beta if beta is not None else 0.0), tf.float32)


# tf-keras optimizers whose slots decay geometrically (s <- a*s + f(g)): (slot list attribute, a's attribute)
_DECAYING_SLOTS = {
    "SGD": (("momentums", "momentum"),),
    "Adam": (("_momentums", "beta_1"), ("_velocities", "beta_2")),
    "AdamW": (("_momentums", "beta_1"), ("_velocities", "beta_2")),
    "RMSprop": (("_velocities", "rho"), ("_momentums", "momentum"), ("_average_gradients", "rho")),
}


def slot_decays(optimizer: Any) -> Dict[int, float]:
    """``id(slot variable) -> a``: the factor a tf-keras optimizer's step multiplies the slot by
    (s ← a·s + f(g): SGD's momentum μ, Adam's β₁ and β₂, RMSprop's ρ and μ). Slots of other optimizers
    and others not of that form (AMSGrad's v̂, Adagrad's sum) are not listed.

    >>> slot_decays(tf_keras.optimizers.SGD(0.1, momentum=0.9))   # before the slots exist  # doctest: +SKIP
    {}
    """
    out: Dict[int, float] = {}
    for slots, hyper in _DECAYING_SLOTS.get(type(optimizer).__name__, ()):
        try:
            a = float(getattr(optimizer, hyper))
        except (AttributeError, TypeError, ValueError):  # a schedule or a tensor: no decay is assumed
            continue
        for v in getattr(optimizer, slots, None) or []:
            out[id(v)] = a
    return out


_SLOT_LISTS_REGISTERED: List[bool] = []


def _slot_list_internals() -> None:
    """Add the slot lists :func:`slot_decays` reads to :data:`INTERNALS` (once; nothing without tf-keras)."""
    if _SLOT_LISTS_REGISTERED:
        return
    try:
        from tf_keras.src.optimizers import adam, rmsprop, sgd
    except ImportError:
        return
    _SLOT_LISTS_REGISTERED.append(True)
    builds = {"SGD": sgd.SGD.build, "Adam": adam.Adam.build, "RMSprop": rmsprop.RMSprop.build}
    for name, build in builds.items():
        INTERNALS.extend((_SetBy(build), slots) for slots, _ in _DECAYING_SLOTS[name])


def optimizer_slots(optimizer: Any) -> List[Any]:
    """Floating slot variables of a tf-keras optimizer (not iterations / learning rate)."""
    if hasattr(optimizer, "_variables") and hasattr(optimizer, "_index_dict"):
        cand = list(optimizer._variables)
    else:
        cand = list(optimizer.variables()) if callable(getattr(optimizer, "variables", None)) else []
    skip = {id(getattr(optimizer, "_iterations", None))}
    lr = getattr(optimizer, "_learning_rate", None)
    skip.add(id(lr))
    return [
        v
        for v in cand
        if id(v) not in skip
        and v.dtype.is_floating
        and isinstance(v, values.DistributedVariable)
        and "learning_rate" not in v.name
    ]


# ---- Keras functional graphs (tf-keras; Keras 3 where it differs), read by tf/keras_walk.py and the ----
# ---- pipeline stages --------------------------------------------------------------------------------------
def keras_layer_graph(model: Any) -> Optional[Any]:
    """The functional graph behind a model (what :func:`keras_nodes_by_depth` reads), or None for a plain
    layer or a subclassed model."""
    if hasattr(model, "_nodes_by_depth") and getattr(model, "_is_graph_network", True):
        return model
    functional = getattr(model, "_functional", None)  # Keras 3 Sequential
    if functional is not None and hasattr(functional, "_nodes_by_depth"):
        return functional
    return None


def keras_nodes_by_depth(graph: Any) -> Dict[int, List[Any]]:
    """The nodes of a functional graph by depth (inputs deepest)."""
    return graph._nodes_by_depth


def keras_nested_outputs(model: Any) -> Any:
    """The nesting of a functional model's outputs (to ``tf.nest.pack_sequence_as`` flat predictions)."""
    return model._nested_outputs


def keras_history(tensor: Any) -> Tuple[Any, int, int]:
    """``(layer, node_index, tensor_index)`` of a symbolic Keras tensor."""
    return tensor._keras_history


def keras_all_layers(model: Any) -> List[Any]:
    """The model and every layer nested in it (each once)."""
    return list(model._flatten_layers(include_self=True))


def keras_inbound_nodes(layer: Any) -> List[Any]:
    """The nodes of a layer's calls in functional graphs, in call order."""
    return layer._inbound_nodes


_LOADERS.append(tf_keras_internals)
_LOADERS.append(_slot_list_internals)
