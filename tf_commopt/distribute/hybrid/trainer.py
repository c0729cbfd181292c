"""GroupedHybridTrainer: a trainer with a strategy's surface running the grouped hybrid's plan.

Example:
    >>> strategy = GroupedHybridTrainer(capacities=[1, 1, 0.5, 0.5], num_groups=2)   # doctest: +SKIP
    >>> with strategy.scope():                                                     # doctest: +SKIP
    ...     strategy.compile(build_model(), optimizer=keras.optimizers.SGD(0.1), loss=loss)
    >>> strategy.fit(dataset, epochs=2)                                            # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from tf_commopt import use_tf_keras

use_tf_keras()  # before TensorFlow loads: tf.keras is tf-keras
import tensorflow as tf

from tf_commopt.core.devices import Cluster
from tf_commopt.core.plan import HybridPlan, PartitionPlan
from tf_commopt.core.planner import plan_hybrid, snake_groups
from tf_commopt.core.schedule.buckets import DEFAULT_BUCKET_BYTES
from tf_commopt.core.schedule.hybrid import HybridProgram, check_groups, hybrid_program, split_batch
from tf_commopt.distribute.hybrid.capacity import resolve_capacities, slowdown_factors
from tf_commopt.distribute.hybrid.executor import ProgramExecutor
from tf_commopt.distribute.hybrid.hosts import discover_hosts, local_devices
from tf_commopt.distribute.hybrid.keras_fit import check_static_batches, wrap_fit
from tf_commopt.distribute.hybrid.program import bucket_variables, stage_maps
from tf_commopt.distribute.pipeline import Pipeline
from tf_commopt.errors import InputError

__all__ = ["GroupedHybridTrainer"]


class GroupedHybridTrainer:
    """Grouped hybrid parallelism: a capacity-aware GPipe pipeline per group, gradients all-reduced.

    Not a ``tf.distribute.Strategy`` subclass: a Strategy's contract is that every replica runs the
    *same* function on its shard with mirrored variables; here each device runs a *different* stage of
    the model. It is a trainer with the surface a training script uses: ``scope``,
    ``num_replicas_in_sync`` (the groups), ``experimental_distribute_dataset`` (global batches, split
    inside the step), ``run`` / ``reduce`` (one global value), ``compile`` then ``model.fit`` /
    ``evaluate`` / ``save_weights`` / ``load_weights`` on the user's model. Limits: the optimizer state
    lives in one optimizer clone per group, so ``.keras`` saves and checkpoints of the user's model do
    not carry the optimizer slots; sample weights are not supported.

    Args:
        devices: device names (default: all logical GPUs, else all logical CPUs).
        capacities: relative speed per device (default all 1), or ``"measure"``
            (:func:`tf_commopt.tf.profiler.relative_capacities`).
        num_groups: G, groups formed by :func:`tf_commopt.core.planner.snake_groups` (default 1).
        groups: explicit groups, lists of indices into ``devices``.
        microbatches: M per group per mini-batch.
        plans: one PartitionPlan per group (layer name -> stage, ``device_of_stage`` indexing the group's
            devices in order); default: the planner's (:func:`tf_commopt.core.planner.plan_hybrid`).
        method, bandwidth_gbps, seed: the planner's partition method, link bandwidth and seed.
        profile_batch_size: batch size of the cost graph the planner reads.
        group_weights: throughput of each group for the batch split (default: the plan's).
        emulate: a device of capacity c runs ``max(capacities) / c`` times slower
            (:mod:`tf_commopt.tf.slowdown`), so one CPU machine shows the capacity effect.
        slowdown: explicit {device: factor} instead of ``emulate``.
        tf_config: one group per TF_CONFIG worker host (default: True when TF_CONFIG lists more than
            one worker). Create the trainer before any other TensorFlow op.
        exclusive_devices: run each device's instructions one after another, as a GPU stream does.
        overlap, bucket_bytes: the program's gradient buckets and overlap
            (:func:`tf_commopt.core.schedule.hybrid.hybrid_program`).
    """

    def __init__(
        self,
        devices: Optional[Sequence[str]] = None,
        capacities: Any = None,
        num_groups: Optional[int] = None,
        groups: Optional[Sequence[Sequence[int]]] = None,
        microbatches: int = 2,
        plans: Optional[Sequence[PartitionPlan]] = None,
        method: str = "ga",
        bandwidth_gbps: float = 10.0,
        seed: int = 0,
        profile_batch_size: int = 32,
        group_weights: Optional[Sequence[float]] = None,
        emulate: bool = False,
        slowdown: Optional[Mapping[str, float]] = None,
        tf_config: Optional[bool] = None,
        exclusive_devices: bool = False,
        overlap: bool = True,
        bucket_bytes: Optional[float] = DEFAULT_BUCKET_BYTES,
    ):
        self._hosts = discover_hosts(tf_config, groups, num_groups)
        self.hosts = self._hosts.hosts if self._hosts else []
        self.task = self._hosts.task if self._hosts else 0
        found = devices if devices is not None else local_devices(self.task if self._hosts else None)
        self.devices = [str(d) for d in found]
        if not self.devices:
            raise InputError("no devices", where="GroupedHybridTrainer(devices=...)")
        self.capacities = resolve_capacities(capacities, self.devices)
        self._formed = groups is None and self._hosts is None  # by the planner's rule, not given
        self.groups = self._form_groups(groups, num_groups)
        if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
            raise InputError(
                f"microbatches must be a positive integer, got {microbatches!r}", where="microbatches"
            )
        self.microbatches = microbatches
        self.num_groups = len(self.hosts) if self._hosts else len(self.groups)
        # global index of each group this process runs (all of them in one process; its own with TF_CONFIG)
        self._global_index = [self.task] if self._hosts else list(range(self.num_groups))
        self.plans = self._check_plans(plans)
        self.method, self.bandwidth_gbps, self.seed = method, float(bandwidth_gbps), int(seed)
        self.profile_batch_size = int(profile_batch_size)
        if group_weights is not None and len(group_weights) != self.num_groups:
            raise InputError(
                f"{len(group_weights)} group weights for {self.num_groups} groups", where="group_weights"
            )
        self._group_weights = None if group_weights is None else [float(w) for w in group_weights]
        self.slowdown = slowdown_factors(self.devices, self.capacities, emulate, slowdown)
        self.exclusive_devices = bool(exclusive_devices)
        self.overlap, self.bucket_bytes = bool(overlap), bucket_bytes
        self.graph: Any = None
        self.hybrid_plan: Optional[HybridPlan] = None
        self.program: Optional[HybridProgram] = None
        self.graph_plans: List[PartitionPlan] = []
        self.executed: List[Tuple[int, Any]] = []
        self.pipelines: List[Pipeline] = []
        self.model: Any = None
        self.last_runs: List[Any] = []
        self._step_fn: Optional[Callable] = None
        self._stats = {"steps": 0, "compute_s": 0.0}

    def _form_groups(
        self, groups: Optional[Sequence[Sequence[int]]], num_groups: Optional[int]
    ) -> List[List[int]]:
        if self._hosts is not None:
            return [list(range(len(self.devices)))]  # this host's group: all its devices
        if groups is not None:
            return check_groups(groups, len(self.devices))
        return snake_groups(self.capacities, 1 if num_groups is None else num_groups)

    def _check_plans(self, plans: Optional[Sequence[PartitionPlan]]) -> Optional[List[PartitionPlan]]:
        if plans is not None and self._hosts is not None and len(plans) == self.num_groups:
            plans = [plans[self.task]]
        if plans is not None and len(plans) != len(self.groups):
            raise InputError(f"{len(plans)} plans for {len(self.groups)} groups", where="plans")
        return list(plans) if plans is not None else None

    # -- the tf.distribute.Strategy surface a training script uses
    @contextlib.contextmanager
    def scope(self) -> Iterator["GroupedHybridTrainer"]:
        """Variables created inside (the user's model and optimizer) live on the first device."""
        with tf.device(self.devices[self.groups[0][0]]):
            yield self

    @property
    def num_replicas_in_sync(self) -> int:
        """Data-parallel replicas: the groups (each a whole model copy, pipelined over its devices)."""
        return self.num_groups

    def experimental_distribute_dataset(self, dataset: Any) -> Any:
        """The dataset itself: each element is one *global* batch, which the step splits among the groups
        (:meth:`group_batch_sizes`). Its batch size must be static (``drop_remainder=True``)."""
        check_static_batches(dataset, None)
        return dataset

    distribute_datasets_from_function = None  # per-replica input pipelines do not fit a split global batch

    def run(self, fn: Callable, args: Sequence[Any] = (), kwargs: Optional[Mapping[str, Any]] = None) -> Any:
        """``fn(*args, **kwargs)`` once, in :meth:`scope`; the result is already global (one value)."""
        with self.scope():
            return fn(*args, **(kwargs or {}))

    def reduce(self, reduce_op: Any, value: Any, axis: Optional[int] = None) -> Any:
        """``value`` (already global, see :meth:`run`); with ``axis``, summed or averaged over it."""
        if axis is None:
            return value
        if reduce_op == tf.distribute.ReduceOp.SUM:
            return tf.reduce_sum(value, axis=axis)
        if reduce_op == tf.distribute.ReduceOp.MEAN:
            return tf.reduce_mean(value, axis=axis)
        raise InputError(
            f"reduce_op must be tf.distribute.ReduceOp.SUM or MEAN, got {reduce_op!r}", where="reduce"
        )

    def group_devices(self, g: int) -> List[str]:
        return [self.devices[i] for i in self.groups[g]]

    # -- set-up
    def compile(self, model: Any, optimizer: Any, loss: Callable, metrics: Any = None) -> None:
        """Take the plan from the planner (or ``plans``), place a copy of ``model`` on each group's
        devices, clone ``optimizer`` per group, and make ``model.fit`` run the hybrid step."""
        from tf_commopt.tf.graph_import import from_keras_model

        self.graph = from_keras_model(model, batch_size=self.profile_batch_size)
        cluster = Cluster.from_capacities(self.capacities, self.bandwidth_gbps)
        if self.plans is None:
            self.hybrid_plan = plan_hybrid(
                self.graph,
                cluster,
                None if self._formed else self.groups,
                num_groups=len(self.groups),
                microbatches=self.microbatches,
                method=self.method,
                seed=self.seed,
            )
            self.groups = self.hybrid_plan.groups
            self.plans = list(self.hybrid_plan.plans)
        self.model, self.loss = model, loss
        if self._hosts is not None:
            self._hosts.broadcast_weights(model)
        self.pipelines = [
            Pipeline(model, plan, devices=self.group_devices(g), microbatches=self.microbatches, loss=loss,
                     optimizer=optimizer.__class__.from_config(optimizer.get_config()), slowdown=self.slowdown,
                     place=True)
            for g, plan in enumerate(self.plans)
        ]  # fmt: skip
        if self.hybrid_plan is None:  # given plans: staged as the pipelines placed them, split by the planner
            order = self.graph.topological_order()
            son = stage_maps(order, [p.layout for p in self.pipelines])
            staged = [dataclasses.replace(p, stage_of_node=s) for p, s in zip(self.plans, son)]
            self.hybrid_plan = plan_hybrid(
                self.graph, cluster, self.groups, microbatches=self.microbatches, plans=staged
            )
        self.graph_plans = list(self.hybrid_plan.plans)
        self._bind_program(model)
        if self._hosts is not None and self._group_weights is None:
            self._group_weights = self._hosts.exchange(self._local_weights()[0])
        model.compile(optimizer=optimizer, loss=loss, metrics=metrics)
        wrap_fit(self, model)
        self._step_fn = None

    def _bind_program(self, model: Any) -> None:
        """The core program of the plan, and the executor running it on the pipelines."""
        order = self.graph.topological_order()
        self.program = hybrid_program(
            order,
            {v: self.graph[v].param_bytes for v in order},
            [p.stage_of_node for p in self.graph_plans],
            self.microbatches,
            self.overlap,
            self.bucket_bytes,
            [p.layout.num_stages for p in self.pipelines],
        )
        self.schedule = self.program.schedule
        index = []
        for pipe in self.pipelines:  # variable k of every group copy <-> model.trainable_weights[k]
            pos = {v.ref(): k for k, v in enumerate(pipe.model.trainable_weights)}
            index.append([pos[v.ref()] for v in pipe.trainable_variables])
        self._index = index
        buckets = bucket_variables(self.program, model)
        self._executor = ProgramExecutor(self.program, self.pipelines, index, buckets, self.exclusive_devices)

    # -- batch split
    @property
    def group_weights(self) -> List[float]:
        """Throughput of each group used to split the global batch (the plan's, or ``group_weights``)."""
        if self._group_weights is not None:
            return list(self._group_weights)
        if self._hosts is not None:
            raise InputError(
                "call strategy.compile(...) first: the hosts exchange their group throughputs there",
                where="GroupedHybridTrainer",
            )
        return self._local_weights()

    def _local_weights(self) -> List[float]:
        if self.hybrid_plan is None:
            raise InputError(
                "call strategy.compile(...) first: the batch split needs the model's cost graph",
                where="GroupedHybridTrainer",
            )
        return [1.0 / t for t in self.hybrid_plan.group_ms]

    def group_batch_sizes(self, batch: int) -> List[int]:
        """Samples of a global batch of ``batch`` that each group trains on."""
        return split_batch(batch, self.group_weights)

    # -- training
    def compute_gradients(self, x: Any, y: Any) -> Tuple[tf.Tensor, List[List[tf.Tensor]]]:
        """Run the program up to the all-reduce: (global mean loss, reduced gradients per group)."""
        if not self.pipelines:
            raise InputError(
                "call strategy.compile(model, optimizer, loss) first", where="GroupedHybridTrainer"
            )
        B = self.pipelines[0]._batch_of(x)
        sizes = self.group_batch_sizes(B)
        xs, ys = Pipeline._split(x, sizes), Pipeline._split(y, sizes)
        runs = [p.begin(xs[gi], ys[gi], total_batch=B) for gi, p in zip(self._global_index, self.pipelines)]
        if any(run.num_microbatches != self.microbatches for run in runs):
            raise InputError(
                f"a group got {sizes} samples, fewer than its {self.microbatches} micro-batches; "
                "use a larger batch or fewer micro-batches",
                where="GroupedHybridTrainer",
            )
        sums, self.executed = self._executor.run(runs)
        self.last_runs = runs
        loss = tf.add_n([tf.identity(run.result()[0]) for run in runs])
        reduced = []
        for g, run in enumerate(runs):
            own = run.result()[1]
            reduced.append([sums[k][g] if k in sums else own[j] for j, k in enumerate(self._index[g])])
        if self._hosts is not None:
            loss, grads = self._hosts.all_reduce(loss, reduced[0], self.pipelines[0].trainable_variables)
            reduced = [grads]
        return loss, reduced

    def _step(self, x: Any, y: Any) -> tf.Tensor:
        loss, reduced = self.compute_gradients(x, y)
        for pipe, grads in zip(self.pipelines, reduced):
            pipe.apply_gradients(grads)
        return loss

    def train_step(self, x: Any, y: Any) -> float:
        """One global mini-batch (all groups, all-reduce, one step per group) inside one ``tf.function``."""
        if self._step_fn is None:
            self._step_fn = tf.function(self._step)
        t0 = time.perf_counter()
        loss = float(self._step_fn(x, y))  # waits for the step
        self._stats["compute_s"] += time.perf_counter() - t0
        self._stats["steps"] += 1
        return loss

    def fit(
        self, dataset: Any, epochs: int = 1, steps_per_epoch: Optional[int] = None
    ) -> Dict[str, List[float]]:
        """Train on ``(x, y)`` batches for ``epochs`` from the user's model's current weights; copies the
        trained weights into the user's model at the end. Returns ``{"loss": [mean loss per epoch]}``."""
        self.push_model()
        hist: Dict[str, List[float]] = {"loss": []}
        for _ in range(epochs):
            losses = []
            for i, (x, y) in enumerate(dataset):
                if steps_per_epoch is not None and i >= steps_per_epoch:
                    break
                losses.append(self.train_step(x, y))
            hist["loss"].append(float(sum(losses) / max(1, len(losses))))
        self.sync_model()
        return hist

    def push_model(self) -> None:
        """Copy the user's model's weights into every group's copy (after ``load_weights`` or a restore)."""
        for pipe in self.pipelines:
            for v, w in zip(pipe.model.weights, self.model.weights):
                v.assign(w)

    def sync_model(self) -> None:
        """Copy group 0's weights into the user's model (all groups hold identical weights)."""
        self.assign_model(lambda t: t)

    def assign_model(self, wrap: Callable) -> None:
        """Assign ``wrap(w)`` of group 0's weights to the user's model."""
        for v, w in zip(self.model.weights, self.pipelines[0].model.weights):
            v.assign(wrap(w))

    def stats(self) -> Dict[str, Any]:
        """Groups, their devices, batch weights, stage layer counts, steps and wall time of train_step."""
        return {
            "groups": [self.group_devices(g) for g in range(len(self.groups))],
            "group_weights": self.group_weights,
            "stage_layers": [
                [len(p.layout.layers_of_stage(s)) for s in range(p.layout.num_stages)] for p in self.pipelines
            ],
            "steps": self._stats["steps"],
            "compute_s": self._stats["compute_s"],
        }
