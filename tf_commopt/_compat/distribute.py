"""TensorFlow distribute internals: host variables, collective keys, worker count and index, the container
strategy, checkpoint children, the parameter-server coordinator's exit, tf.data autotuning of
tf.distribute's per-device datasets.

Example:
    >>> from tf_commopt._compat import num_workers        # doctest: +SKIP
    >>> num_workers(tf.distribute.MirroredStrategy())      # doctest: +SKIP
    1
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import tensorflow as tf

from tf_commopt._compat._gate import (
    SUPPORTED_TF,
    cluster_coordinator,
    collective_all_reduce_strategy,
    cross_device_ops,
    cross_device_utils,
    distribute_lib,
    multi_device_iterator_ops,
    parameter_server_strategy_v2,
    resource_variable_ops,
    values,
)
from tf_commopt.errors import TfCommoptError


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


def own_collective_reducer(ext: Any, key_offset: int) -> Optional[Callable[..., Any]]:
    """``reduce_to(op, value, destinations)`` over the workers of ``ext`` (a multi-worker StrategyExtended) in
    a collective group of its own (group key = the strategy's key base + ``key_offset``); None when ``ext``
    all-reduces without collective keys (one process).

    A collective in a ``tf.function`` draws its instance key when the function is *called*, from one
    counter per group; a function called from a second thread while the first runs eager reductions (tf-keras
    reads every metric at an epoch's end) could draw its keys in a different order on different workers,
    pairing unrelated all-reduces. A group of its own gives the second thread a counter of its own.

    >>> reduce_to = own_collective_reducer(strategy.extended, 90_000)   # doctest: +SKIP
    """
    ops = getattr(ext, "_cross_device_ops", None)
    if not isinstance(ops, cross_device_ops.CollectiveAllReduce) or num_workers(ext) <= 1:
        return None
    keys = cross_device_utils.CollectiveKeys(
        group_key_start=1 + container_strategy(ext)._collective_key_base + int(key_offset)
    )
    own = cross_device_ops.CollectiveAllReduce(
        devices=list(ext.worker_devices),
        group_size=ops._group_size,
        options=ext._communication_options,
        collective_keys=keys,
    )
    return lambda op, value, destinations: own.reduce(op, value, destinations=destinations)


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
    if "_coalesced_children" in vars(parent):  # a tf-keras optimizer that already listed its children
        from tf_commopt._compat.keras import refresh_checkpoint_children

        refresh_checkpoint_children(parent)


# ---- the parameter-server coordinator (distribute/ps/trainer.py) ----------------------------------------
def unblock_coordinator_exit(coordinator: Any) -> None:
    """Let the chief exit after a worker was lost (TF 2.21 would hang at exit otherwise).

    After a worker failure, TensorFlow's WorkerPreemptionHandler thread holds ``_cluster_update_lock``
    while it waits (for good) for the worker to come back, and ``ClusterCoordinator.__del__`` ->
    ``handler.stop()`` waits for that lock: the process never ends. This coordinator's handler (one
    instance, not the class) gets a ``stop()`` that gives up on the lock after a second; the handler
    thread is a daemon thread.
    """
    handler = _internal(
        _internal(coordinator, "_cluster", "ClusterCoordinator"), "failure_handler", "Cluster"
    )
    if not isinstance(handler, cluster_coordinator.WorkerPreemptionHandler):
        return  # TF_PSS_ENABLE_COORDINATION_SERVICE: another handler, without this lock
    if getattr(handler, "_tf_commopt_patched", False):
        return
    lock = _internal(handler, "_cluster_update_lock", "WorkerPreemptionHandler")
    event = _internal(handler, "_cluster_due_for_update_or_finish", "WorkerPreemptionHandler")

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


def first_replica_spec(spec: Any) -> Any:
    """One replica's element spec from a distributed iterator's ``element_spec``: every ``PerReplicaSpec``
    (several local replicas) replaced by its first replica's spec; anything else unchanged.

    >>> first_replica_spec(tf.TensorSpec([None, 3]))
    TensorSpec(shape=(None, 3), dtype=tf.float32, name=None)
    """

    def one(s: Any) -> Any:
        return s._value_specs[0] if isinstance(s, values.PerReplicaSpec) else s

    return tf.nest.map_structure(one, spec)


# ---- the parameter-server strategy (distribute/ps/) -------------------------------------------------------
def _internal(obj: Any, name: str, owner: str) -> Any:
    """``obj.name``, or a one-line TfCommoptError naming the missing TensorFlow internal ``owner.name``."""
    try:
        return getattr(obj, name)
    except AttributeError:
        raise TfCommoptError(
            f"TensorFlow {tf.__version__} has no {owner}.{name}, which tf_commopt relies on (tested with "
            f"TensorFlow {', '.join(SUPPORTED_TF)}; tf_commopt._compat.INTERNALS lists every such internal)"
        ) from None


def ps_cluster_spec(strategy: Any) -> Dict[str, List[str]]:
    """job -> task addresses of a ``tf.distribute.ParameterServerStrategy`` (its cluster resolver's spec).

    A one-line TfCommoptError if this TensorFlow keeps the resolver elsewhere.

    >>> ps_cluster_spec(strategy)["worker"]   # doctest: +SKIP
    ['127.0.0.1:41203', '127.0.0.1:38417']
    """
    resolver = _internal(strategy, "_cluster_resolver", "ParameterServerStrategy")
    spec = resolver.cluster_spec()
    return {job: list(spec.job_tasks(job)) for job in spec.jobs}
