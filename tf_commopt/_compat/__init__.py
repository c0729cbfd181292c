"""The one place that touches TensorFlow and tf-keras internals (private modules and attributes).

Everything else in tf_commopt uses public TensorFlow API or imports from here. At import the version gate
(:mod:`tf_commopt._compat._gate`) checks the installed TensorFlow against the range tf_commopt was tested
with and fails with a one-line error naming that range (override with ``TF_COMMOPT_SKIP_VERSION_CHECK=1``
at your own risk). ``tests/tf/test_compat.py`` enumerates every internal listed in :data:`INTERNALS` and
fails loudly when one is missing, and a strategy calls :func:`require_internals` when it is built, so a
TensorFlow upgrade breaks one test or stops a run at start-up, never silently half-way.

Modules: ``_gate`` (version check, the private TensorFlow modules, :data:`INTERNALS`), ``distribute``
(strategies, collectives, the parameter-server coordinator, tf.data), ``keras`` (tf-keras), ``graph``
(TensorFlow graphs). Every name is importable from ``tf_commopt._compat``.

Example:
    >>> from tf_commopt import _compat          # doctest: +SKIP
    >>> _compat.check_internals()               # doctest: +SKIP
    []
"""

from __future__ import annotations

from tf_commopt._compat._gate import (  # noqa: F401
    INTERNALS,
    SUPPORTED_TF,
    _SetBy,
    check_internals,
    cluster_coordinator,
    collective_all_reduce_strategy,
    collective_util,
    distribute_lib,
    framework_ops,
    mirrored_strategy,
    multi_device_iterator_ops,
    parameter_server_strategy_v2,
    require_internals,
    resource_variable_ops,
    save_context,
    slurm_cluster_resolver,
    tfconfig_cluster_resolver,
    trackable_base,
    values,
)
from tf_commopt._compat.distribute import (
    container_strategy,
    device_iterators_without_autotune,
    first_replica_spec,
    fresh_mirrored_strategy,
    host_variable,
    next_collective_key_base,
    no_autotune,
    num_workers,
    own_collective_reducer,
    ps_cluster_spec,
    strategy_cluster_resolver,
    track_child,
    unblock_coordinator_exit,
    worker_index,
)
from tf_commopt._compat.graph import (
    graph_function,
    op_control_outputs,
    op_statistic,
)
from tf_commopt._compat.keras import (
    backup_supported_strategies,
    backup_training_state,
    fit_starting_at,
    keras_all_layers,
    keras_compiled_metrics,
    keras_history,
    keras_inbound_nodes,
    keras_layer_graph,
    keras_mean_metric_fn,
    keras_model_strategy,
    keras_nested_outputs,
    keras_nodes_by_depth,
    optimizer_lr,
    optimizer_mesh,
    optimizer_momentum,
    optimizer_schedule,
    optimizer_slots,
    refresh_checkpoint_children,
    set_backup_supported_strategies,
    slot_decays,
    tf_keras_internals,
    training_state_model,
)
from tf_commopt.errors import TfCommoptError  # noqa: F401  (the error the internals raise)

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
    "fit_starting_at",
    "refresh_checkpoint_children",
    "optimizer_lr",
    "optimizer_momentum",
    "optimizer_slots",
    "slot_decays",
    "next_collective_key_base",
    "own_collective_reducer",
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
    "ps_cluster_spec",
    "no_autotune",
    "device_iterators_without_autotune",
    "first_replica_spec",
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
    "optimizer_schedule",
    "keras_compiled_metrics",
    "keras_mean_metric_fn",
    "multi_device_iterator_ops",
    "parameter_server_strategy_v2",
]
