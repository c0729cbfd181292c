"""The version gate and the list of TensorFlow / tf-keras internals tf_commopt relies on.

At import it checks the installed TensorFlow against the range tf_commopt was tested with and fails with a
one-line error naming that range (override with ``TF_COMMOPT_SKIP_VERSION_CHECK=1`` at your own risk).
:data:`INTERNALS` lists every private module attribute, class attribute and instance attribute (through
:class:`_SetBy`) the package uses; :func:`check_internals` names the missing ones and
:func:`require_internals` turns them into a one-line error at a strategy's start-up.

Example:
    >>> from tf_commopt._compat import check_internals   # doctest: +SKIP
    >>> check_internals()                                  # doctest: +SKIP
    []
"""

from __future__ import annotations

import inspect
import os
from typing import Any, List, Tuple

import tensorflow as tf

from tf_commopt.errors import TfCommoptError

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
from tensorflow.python.data.ops import multi_device_iterator_ops
from tensorflow.python.distribute import (
    collective_all_reduce_strategy,
    collective_util,
    cross_device_ops,
    cross_device_utils,
    distribute_lib,
    mirrored_strategy,
    parameter_server_strategy_v2,
    values,
)
from tensorflow.python.distribute.cluster_resolver import (
    slurm_cluster_resolver,
    tfconfig_cluster_resolver,
)
from tensorflow.python.distribute.coordinator import cluster_coordinator
from tensorflow.python.framework import ops as framework_ops
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.saved_model import save_context
from tensorflow.python.trackable import base as trackable_base


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


# functions that add lazily imported internals to INTERNALS (the tf-keras ones); check_internals() calls them
_LOADERS: List[Any] = []

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
    # unblock_coordinator_exit (distribute/ps/trainer.py)
    (cluster_coordinator.ClusterCoordinator, "__del__"),
    (_SetBy(cluster_coordinator.ClusterCoordinator.__init__), "_cluster"),
    (_SetBy(cluster_coordinator.Cluster.__init__), "failure_handler"),
    (cluster_coordinator.WorkerPreemptionHandler, "stop"),
    (_SetBy(cluster_coordinator.WorkerPreemptionHandler.__init__), "_cluster_update_lock"),
    (_SetBy(cluster_coordinator.WorkerPreemptionHandler.__init__), "_cluster_due_for_update_or_finish"),
    (_SetBy(cluster_coordinator.WorkerPreemptionHandler.__init__), "_should_preemption_thread_run"),
    # ps_cluster_spec: the strategy keeps its cluster resolver here (strategy.cluster_resolver is None)
    (_SetBy(parameter_server_strategy_v2.ParameterServerStrategyV2.__init__), "_cluster_resolver"),
    # device_iterators_without_autotune: the per-device datasets of tf.distribute's input iterators
    (multi_device_iterator_ops, "_create_device_dataset"),
    # own_collective_reducer (distribute/overlap.py): a collective all-reduce in a group of its own
    (cross_device_ops, "CollectiveAllReduce"),
    (cross_device_utils, "CollectiveKeys"),
    (_SetBy(cross_device_ops.CollectiveAllReduce.__init__), "_group_size"),
    (_SetBy(collective_all_reduce_strategy.CollectiveAllReduceExtended.__init__), "_communication_options"),
    (
        _SetBy(collective_all_reduce_strategy.CollectiveAllReduceExtended._initialize_multi_worker),
        "_cross_device_ops",
    ),
    # first_replica_spec (distribute/graph_loop.py): one replica's element spec of a distributed iterator
    (values, "PerReplicaSpec"),
    (_SetBy(values.PerReplicaSpec.__init__), "_value_specs"),
]


def check_internals() -> List[str]:
    """Names of the internals in :data:`INTERNALS` that this TensorFlow (and tf-keras) lacks (empty when all
    is well)."""
    for load in _LOADERS:  # e.g. tf_keras_internals(), which registers the tf-keras entries
        load()
    missing = []
    for obj, attr in INTERNALS:
        if not hasattr(obj, attr):
            missing.append(f"{getattr(obj, '__name__', obj)}.{attr}")
    return missing


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
