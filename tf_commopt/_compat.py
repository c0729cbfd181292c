"""The one place that touches TensorFlow and tf-keras internals (private modules and attributes).

Everything else in tf_commopt uses public TensorFlow API or imports from here. At import this module
checks the installed versions against the range it was written and tested for and fails with a
one-line error naming that range (override with ``TF_COMMOPT_SKIP_VERSION_CHECK=1`` at your own risk).
``tests/tf/test_compat.py`` enumerates every internal listed in :data:`INTERNALS` and fails loudly
when one is missing, so a TensorFlow upgrade breaks one test, not a training run.

Example:
    >>> from tf_commopt import _compat          # doctest: +SKIP
    >>> _compat.check_internals()               # doctest: +SKIP
    []
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf

from tf_commopt.errors import TfCommoptError

__all__ = [
    "SUPPORTED_TF",
    "INTERNALS",
    "check_internals",
    "host_variable",
    "values",
    "mirrored_strategy",
    "collective_all_reduce_strategy",
    "collective_util",
    "distribute_lib",
    "tfconfig_cluster_resolver",
    "slurm_cluster_resolver",
    "resource_variable_ops",
    "save_context",
    "trackable_base",
    "tf_keras_internals",
    "optimizer_lr",
    "optimizer_momentum",
    "optimizer_slots",
    "next_collective_key_base",
    "fresh_mirrored_strategy",
    "framework_ops",
    "cluster_coordinator",
    "op_statistic",
    "keras_layer_graph",
    "keras_nodes_by_depth",
    "keras_nested_outputs",
    "keras_history",
    "keras_inbound_nodes",
    "keras_all_layers",
    "graph_function",
    "op_control_outputs",
    "unblock_coordinator_exit",
    "no_autotune",
    "device_iterators_without_autotune",
    "require_internals",
    "num_workers",
    "worker_index",
    "container_strategy",
    "strategy_cluster_resolver",
    "track_child",
    "keras_model_strategy",
    "optimizer_mesh",
    "backup_supported_strategies",
    "set_backup_supported_strategies",
    "backup_training_state",
    "training_state_model",
]

SUPPORTED_TF: Tuple[str, ...] = ("2.21",)
"""TensorFlow major.minor versions this release was tested with (tf-keras must match)."""


def _check_version() -> None:
    if os.environ.get("TF_COMMOPT_SKIP_VERSION_CHECK") == "1":
        return
    mm = ".".join(tf.__version__.split(".")[:2])
    if mm not in SUPPORTED_TF:
        raise TfCommoptError(
            f"tf_commopt supports TensorFlow {', '.join(SUPPORTED_TF)}.x (it relies on "
            f"tf.distribute internals), found {tf.__version__}; install tensorflow=="
            f"{SUPPORTED_TF[-1]}.* tf-keras=={SUPPORTED_TF[-1]}.* or set "
            "TF_COMMOPT_SKIP_VERSION_CHECK=1"
        )


_check_version()

# ---- private TensorFlow modules (tensorflow.python.*) -------------------------------------------------
from tensorflow.python.data.ops import multi_device_iterator_ops  # noqa: E402
from tensorflow.python.distribute import (  # noqa: E402
    collective_all_reduce_strategy,  # noqa: E402
    collective_util,  # noqa: E402
    distribute_lib,  # noqa: E402
    mirrored_strategy,  # noqa: E402
    parameter_server_strategy_v2,  # noqa: E402
    values,  # noqa: E402
)
from tensorflow.python.distribute.cluster_resolver import (  # noqa: E402
    slurm_cluster_resolver,  # noqa: E402
    tfconfig_cluster_resolver,  # noqa: E402
)
from tensorflow.python.distribute.coordinator import cluster_coordinator  # noqa: E402
from tensorflow.python.framework import ops as framework_ops  # noqa: E402
from tensorflow.python.ops import resource_variable_ops  # noqa: E402
from tensorflow.python.saved_model import save_context  # noqa: E402
from tensorflow.python.trackable import base as trackable_base  # noqa: E402


class _SetBy:
    """Stands for the instances of a class whose method ``func`` sets the attributes (instance attributes
    are not on the class): ``hasattr(_SetBy(f), name)`` is whether ``f``'s code names ``name``.

    >>> hasattr(_SetBy(_SetBy.__init__), "_names"), hasattr(_SetBy(_SetBy.__init__), "_gone")
    (True, False)
    """

    def __init__(self, func: Any) -> None:
        func = inspect.unwrap(func)
        self.__name__ = f"{func.__qualname__}() sets self"
        self._names = frozenset(func.__code__.co_names)

    def __getattr__(self, name: str) -> bool:
        if name in self.__dict__.get("_names", ()):
            return True
        raise AttributeError(name)


# (object, attribute) pairs the package relies on; check_internals() verifies each exists
INTERNALS: List[Tuple[Any, str]] = [
    (values, "MirroredVariable"),
    (values, "SyncOnReadVariable"),
    (values, "DistributedValues"),
    (values, "DistributedVariable"),
    (values, "PerReplica"),
    (values.MirroredVariable, "_get_cross_replica"),
    (mirrored_strategy, "MirroredExtended"),
    (collective_all_reduce_strategy, "CollectiveAllReduceExtended"),
    (collective_all_reduce_strategy.CollectiveAllReduceExtended, "_reduce"),
    (mirrored_strategy.MirroredExtended, "_reduce_to"),
    (mirrored_strategy.MirroredExtended, "_create_variable"),
    (collective_all_reduce_strategy.CollectiveAllReduceExtended, "_create_variable"),
    (collective_util, "Options"),
    (distribute_lib, "Strategy"),
    (tfconfig_cluster_resolver, "TFConfigClusterResolver"),
    (resource_variable_ops, "ResourceVariable"),
    (save_context, "in_save_context"),
    (trackable_base, "Trackable"),
    (trackable_base.Trackable, "_serialize_to_tensors"),
    # distribute/slurm.py sets _gpus_per_node/_gpus_per_task and reads _task_configuration (set by these)
    (slurm_cluster_resolver.SlurmClusterResolver, "_resolve_task_configuration"),
    (slurm_cluster_resolver.SlurmClusterResolver, "cluster_spec"),
    # tf/op_costs.py: TensorFlow's registered per-op statistics ("flops")
    (framework_ops, "get_stats_for_node_def"),
    # tf/model_files.py and tf/train_graph.py
    (tf.Graph, "_get_function"),
    (tf.Operation, "_control_outputs"),
    # track_child: the skip-and-correct state is a checkpointed child of its optimizer
    (trackable_base.Trackable, "_track_trackable"),
    # num_workers, worker_index, container_strategy, strategy_cluster_resolver
    (_SetBy(collective_all_reduce_strategy.CollectiveAllReduceExtended._initialize_local), "_num_workers"),
    (
        _SetBy(collective_all_reduce_strategy.CollectiveAllReduceExtended._initialize_multi_worker),
        "_num_workers",
    ),
    (_SetBy(collective_all_reduce_strategy.CollectiveAllReduceExtended._initialize_local), "_id_in_cluster"),
    (
        _SetBy(collective_all_reduce_strategy.CollectiveAllReduceExtended._initialize_multi_worker),
        "_id_in_cluster",
    ),
    (_SetBy(collective_all_reduce_strategy.CollectiveAllReduceExtended.__init__), "_cluster_resolver"),
    (_SetBy(parameter_server_strategy_v2.ParameterServerStrategyV2Extended.__init__), "_num_workers"),
    (distribute_lib.StrategyExtendedV2, "_container_strategy"),
    # unblock_coordinator_exit (distribute/parameter_server.py)
    (cluster_coordinator.ClusterCoordinator, "__del__"),
    (_SetBy(cluster_coordinator.ClusterCoordinator.__init__), "_cluster"),
    (_SetBy(cluster_coordinator.Cluster.__init__), "failure_handler"),
    (cluster_coordinator.WorkerPreemptionHandler, "stop"),
    (_SetBy(cluster_coordinator.WorkerPreemptionHandler.__init__), "_cluster_update_lock"),
    (_SetBy(cluster_coordinator.WorkerPreemptionHandler.__init__), "_cluster_due_for_update_or_finish"),
    (_SetBy(cluster_coordinator.WorkerPreemptionHandler.__init__), "_should_preemption_thread_run"),
    # device_iterators_without_autotune: the per-device datasets of tf.distribute's input iterators
    (multi_device_iterator_ops, "_create_device_dataset"),
]


def check_internals() -> List[str]:
    """Names of the internals in :data:`INTERNALS` that this TensorFlow (and tf-keras) lacks (empty when all
    is well)."""
    tf_keras_internals()  # registers the tf-keras entries
    missing = []
    for obj, attr in INTERNALS:
        if not hasattr(obj, attr):
            missing.append(f"{getattr(obj, '__name__', obj)}.{attr}")
    return missing


def host_variable(value: Any, dtype: tf.DType, name: str) -> tf.Variable:
    """A plain (non-distributed) variable on the host CPU, created outside any strategy's creator.

    >>> v = host_variable(0, tf.int64, "steps")   # doctest: +SKIP
    """
    with tf.init_scope(), tf.device("/CPU:0"):
        return resource_variable_ops.ResourceVariable(tf.constant(value, dtype), name=name, trainable=False)


# ---- collective keys ------------------------------------------------------------------------------------
_KEY_BASES = {"next": 0}


def next_collective_key_base() -> int:
    """A collective-key base no other strategy of this process uses (the one allocator of the package).

    Two strategies over overlapping devices in one process otherwise both start at group key 1 and the
    second one's collectives abort ("joining a group with size 2, but that group has size 4"); TensorFlow's
    own tests shift ``_collective_key_base`` per strategy. Every worker of a cluster that builds its
    strategies in the same order gets the same sequence.

    >>> a, b = next_collective_key_base(), next_collective_key_base()   # doctest: +SKIP
    >>> b - a                                                          # doctest: +SKIP
    100000
    """
    _KEY_BASES["next"] += 1
    return 10_000_000 + 100_000 * _KEY_BASES["next"]


def fresh_mirrored_strategy(devices: Any) -> tf.distribute.MirroredStrategy:
    """A ``tf.distribute.MirroredStrategy`` over ``devices`` with its own collective keys."""
    cls = tf.distribute.MirroredStrategy
    old = cls._collective_key_base
    cls._collective_key_base = next_collective_key_base()
    try:
        return cls(devices)
    finally:
        cls._collective_key_base = old


# ---- strategy internals: worker count and index, the container strategy, checkpoint children ---------
def require_internals(where: str) -> None:
    """Raise a one-line error naming every internal of :data:`INTERNALS` this TensorFlow lacks (a strategy
    calls it when it is built, so a renamed internal stops the run at start-up, not half-way through it).

    >>> require_internals("SkipCorrectStrategy")   # doctest: +SKIP
    """
    missing = check_internals()
    if missing:
        raise TfCommoptError(
            f"{where}: this TensorFlow {tf.__version__} lacks internals tf_commopt relies on: "
            f"{', '.join(missing)} (supported: TensorFlow {', '.join(SUPPORTED_TF)})"
        )


# the StrategyExtended classes that count their workers (``_num_workers``); any other extended (Mirrored,
# OneDevice, the default strategy) runs in one process: one worker
_COUNTS_WORKERS = (
    collective_all_reduce_strategy.CollectiveAllReduceExtended,
    parameter_server_strategy_v2.ParameterServerStrategyV2Extended,
)


def _extended(strategy_or_extended: Any) -> Any:
    if isinstance(strategy_or_extended, distribute_lib.StrategyBase):
        return strategy_or_extended.extended
    return strategy_or_extended


def num_workers(strategy_or_extended: Any) -> int:
    """How many worker processes a strategy spans (``_num_workers`` of the multi-worker and parameter-server
    extendeds; 1 for the single-process ones).

    >>> num_workers(tf.distribute.MirroredStrategy(["/CPU:0"]))   # doctest: +SKIP
    1
    """
    ext = _extended(strategy_or_extended)
    return int(ext._num_workers) if isinstance(ext, _COUNTS_WORKERS) else 1


def worker_index(strategy_or_extended: Any) -> int:
    """This worker's index among the workers of a multi-worker strategy (``_id_in_cluster``; 0 in one
    process)."""
    ext = _extended(strategy_or_extended)
    if isinstance(ext, collective_all_reduce_strategy.CollectiveAllReduceExtended):
        return int(ext._id_in_cluster)
    return 0


def container_strategy(extended: Any) -> Any:
    """The Strategy that owns a StrategyExtended (``_container_strategy()``)."""
    return extended._container_strategy()


def strategy_cluster_resolver(strategy_or_extended: Any) -> Optional[Any]:
    """The ClusterResolver of a multi-worker strategy (``_cluster_resolver``), None in one process."""
    ext = _extended(strategy_or_extended)
    if isinstance(ext, collective_all_reduce_strategy.CollectiveAllReduceExtended):
        return ext._cluster_resolver
    return None


def track_child(parent: Any, child: Any, name: str) -> None:
    """Make ``child`` a checkpointed dependency of ``parent`` named ``name`` (``_track_trackable``), so
    ``tf.train.Checkpoint``/``save_weights`` of the parent hold it."""
    parent._track_trackable(child, name=name, overwrite=True)


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
    learning rate is a constant (parameter-server update rules, ``distribute/ps_rules.py``)."""
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


# ---- TensorFlow graph statistics (tf/op_costs.py) ------------------------------------------------------
def op_statistic(graph: Any, node_def: Any, statistic: str = "flops") -> Optional[float]:
    """TensorFlow's registered statistic (``"flops"``) of one op, or None when the op has none or needs a
    shape that is unknown."""
    try:
        return framework_ops.get_stats_for_node_def(graph, node_def, statistic).value
    except (ValueError, TypeError, KeyError):
        return None


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


# ---- TensorFlow graphs (tf/model_files.py, tf/train_graph.py) ---------------------------------------------
def graph_function(graph: Any, name: str) -> Optional[Any]:
    """The function ``name`` defined in ``graph`` (or an outer graph), or None."""
    return graph._get_function(name)


def op_control_outputs(op: Any) -> List[Any]:
    """The ops with a control dependency on ``op``."""
    return list(op._control_outputs)


# ---- the parameter-server coordinator (distribute/parameter_server.py) ----------------------------------
def unblock_coordinator_exit(coordinator: Any) -> None:
    """Let the chief exit after a worker was lost (TF 2.21 would hang at exit otherwise).

    After a worker failure, TensorFlow's WorkerPreemptionHandler thread holds ``_cluster_update_lock``
    while it waits (for good) for the worker to come back, and ``ClusterCoordinator.__del__`` ->
    ``handler.stop()`` waits for that lock: the process never ends. This coordinator's handler (one
    instance, not the class) gets a ``stop()`` that gives up on the lock after a second; the handler
    thread is a daemon thread.
    """
    handler = getattr(getattr(coordinator, "_cluster", None), "failure_handler", None)
    lock = getattr(handler, "_cluster_update_lock", None)
    event = getattr(handler, "_cluster_due_for_update_or_finish", None)
    if handler is None or lock is None or event is None or getattr(handler, "_tf_commopt_patched", False):
        return

    def stop() -> None:
        handler._should_preemption_thread_run = False
        if lock.acquire(timeout=1.0):
            try:
                event.set()
            finally:
                lock.release()

    handler.stop = stop
    handler._tf_commopt_patched = True


# ---- tf.data iterator deletion (the teardown stall at the end of model.fit) -------------------------------
def no_autotune(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """``dataset`` with tf.data autotuning off (no autotune model thread in its iterators).

    Why: in TF 2.21 deleting an iterator whose autotune thread (``tf_data_model``, ``Model::OptimizeLoop``)
    is between two optimizations can miss its wake-up: the cancellation callback notifies the thread
    *before* the CancellationManager marks itself cancelled, the thread re-checks ``IsCancelled()`` (still
    false) and sleeps again until its next scheduled optimization. Those are 10 ms x (2^(k+1) - 1) after
    the iterator's first element (the period doubles from 10 ms up to 60 s), so the deletion blocks for up
    to a minute; tf-keras deletes its iterator when ``fit`` returns (docs/results/overlap.md).
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def device_iterators_without_autotune() -> None:
    """Build the per-device datasets of tf.distribute's input iterators without autotuning (idempotent).

    Every ``MultiDeviceIterator`` (what ``distribute_datasets_from_function`` / ``experimental_distribute_dataset``
    of Mirrored, MultiWorkerMirrored and SkipCorrectStrategy iterate with) feeds each device from a small
    per-device dataset (a generator reading the host buffer, then a fixed ``prefetch``) that has nothing to
    tune, yet gets default options, so its iterator runs an autotune thread whose deletion can block for up
    to 60 s (:func:`no_autotune`). The user's (host) dataset keeps its own options: give it
    :func:`no_autotune` too to avoid the stall there. Process-wide (TensorFlow's module function is
    replaced by a wrapper that calls it and turns autotuning off on the result).
    """
    original = multi_device_iterator_ops._create_device_dataset
    if getattr(original, "_tf_commopt_no_autotune", False):
        return

    def create_device_dataset(*args: Any, **kwargs: Any) -> tf.data.Dataset:
        return no_autotune(original(*args, **kwargs))

    create_device_dataset._tf_commopt_no_autotune = True  # type: ignore[attr-defined]
    create_device_dataset.__wrapped__ = original  # type: ignore[attr-defined]
    multi_device_iterator_ops._create_device_dataset = create_device_dataset
