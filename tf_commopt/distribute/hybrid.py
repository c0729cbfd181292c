"""GroupedHybridTrainer: pipelines inside device groups, synchronous data parallelism between groups.

Example:
    >>> import tf_keras as keras                                                   # doctest: +SKIP
    >>> from tf_commopt.distribute.hybrid import GroupedHybridTrainer
    >>> strategy = GroupedHybridTrainer(devices=["/GPU:0", "/GPU:1", "/GPU:2", "/GPU:3"],
    ...                                  capacities=[1, 1, 0.5, 0.5], num_groups=2, microbatches=4)  # doctest: +SKIP
    >>> with strategy.scope():                                                     # doctest: +SKIP
    ...     model = build_model()
    ...     strategy.compile(model, optimizer=keras.optimizers.SGD(0.1),
    ...                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    >>> strategy.fit(dataset, epochs=2)          # or: strategy.train_step(x, y); or model.fit(dataset)  # doctest: +SKIP

The device-aware grouped hybrid strategy of thesis 000 (after HetPipe: Park et al., "HetPipe: Enabling
Large DNN Training on (Whimpy) Heterogeneous GPU Clusters through Integration of Pipelined Model
Parallelism and Data Parallelism", USENIX ATC 2020; pipelines: GPipe, Huang et al., NeurIPS 2019).
The exact rules:

* **Groups.** Given ``groups`` (lists of device indices) they are used as is; with a multi-worker
  TF_CONFIG, one group per worker host (each process runs its host's group on its local devices; the
  hosts start from host 0's weights, exchange their throughputs once, slice the same global batch and
  sum their gradients with one collective per step). Otherwise :func:`form_groups`: devices sorted by capacity (descending, ties by
  index) are dealt to ``num_groups`` groups in snake order (0, 1, .., G-1, G-1, .., 0, 0, ..), so group
  sizes differ by at most one and their total capacities are close; each group keeps its devices in
  index order.
* **Partition per group.** Each group's pipeline is the capacity-aware partition of the model's layer
  graph (:func:`tf_commopt.tf.graph_import.from_keras_model` then :func:`tf_commopt.partition.partition`
  with the group's capacities): a device of capacity c gets a stage whose time / c is balanced with
  the others, i.e. slower devices get smaller segments. Or pass ``plans`` (one PartitionPlan per group).
* **One definition.** Grouping, batch split, gradient buckets and the instruction streams are
  :mod:`tf_commopt.core.hybrid`, the same functions the simulator (:mod:`tf_commopt.core.simulate.hybrid`)
  binds to costs: :attr:`GroupedHybridTrainer.program` is ``hybrid_program(...)`` of the model's cost
  graph and the groups' plans, and the executor runs exactly its streams (in an order from
  :func:`tf_commopt.distribute.pipeline.execution_order`; ``executed`` records it).
* **Batch split.** Group g's share is ``(1/t_g) / sum(1/t_h)`` with ``t_g`` its pipeline alone on the
  whole batch, simulated on the cost graph (:func:`tf_commopt.core.simulate.hybrid.group_alone_ms`),
  or ``group_weights`` if given; ``B_g`` = largest-remainder rounding, each group at least one sample
  (:func:`split_batch`).
* **Gradient weighting.** Group g splits B_g into M micro-batches of b_{g,m} samples and weights each
  micro-batch loss by ``b_{g,m} / B``; the all-reduce SUMS the groups' gradients. So the update uses
  ``sum_g sum_m (b_{g,m} / B) * grad(mean loss of micro-batch (g, m))`` = the gradient of the global
  batch's mean loss, exactly what one device training on the whole batch computes, whatever the
  (uneven) B_g.
* **All-reduce and step.** Each ``AllReduce("grads<i>")`` sums bucket i's variables' gradients over the
  groups as one fused vector (concatenated, summed, split back): every holder adds all groups' vectors
  in group order on its own device (bit-identical copies). Its TensorFlow ops depend only on that
  bucket's gradients, so the runtime starts them while other gradients are still being computed (the overlap of ``overlap=True``; piece ranks'
  ``Backward`` instructions are parts of their stage's last backward, which TensorFlow runs as one
  gradient call). After every ``OptimizerStep`` each group's own optimizer (a clone of the one given)
  applies the reduced gradients.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from tf_commopt import use_tf_keras  # noqa: E402

use_tf_keras()  # before TensorFlow loads: tf.keras is tf-keras
import tensorflow as tf  # noqa: E402

from tf_commopt._compat import keras_nested_outputs  # noqa: E402
from tf_commopt.core.hybrid import (  # noqa: E402
    DEFAULT_BUCKET_BYTES,
    HybridProgram,
    hybrid_program,
    snake_groups,
    split_batch,
)
from tf_commopt.core.plan import PartitionPlan  # noqa: E402
from tf_commopt.core.schedule import AllReduce, OptimizerStep, Schedule  # noqa: E402
from tf_commopt.distribute.pipeline import (  # noqa: E402
    Pipeline,
    execution_order,
)
from tf_commopt.errors import InputError  # noqa: E402
from tf_commopt.tf.slowdown import canonical_device  # noqa: E402

__all__ = ["GroupedHybridTrainer", "form_groups", "split_batch", "groups_from_tf_config"]


# ----------------------------------------------------------------------------- pure rules
def form_groups(capacities: Sequence[float], num_groups: int) -> List[List[int]]:
    """Deal devices, fastest first, to ``num_groups`` groups in snake order (see module docstring).

    >>> form_groups([1, 1, 1, 0.5], 2)
    [[0, 3], [1, 2]]
    >>> form_groups([1, 0.5, 0.25, 1, 1, 0.5], 3)
    [[0, 2], [3, 5], [1, 4]]
    """
    return snake_groups(capacities, num_groups)  # the one rule, shared with the simulator


def groups_from_tf_config(tf_config: Optional[str] = None) -> Tuple[List[str], int]:
    """(worker host addresses, this task's index) from TF_CONFIG: one group per worker host.

    >>> groups_from_tf_config('{"cluster": {"worker": ["h0:1", "h1:1"]}, "task": {"type": "worker", "index": 1}}')
    (['h0:1', 'h1:1'], 1)
    """
    text = tf_config if tf_config is not None else os.environ.get("TF_CONFIG", "")
    from tf_commopt.core.tfconfig import parse_tf_config

    cfg = parse_tf_config(text)  # one-line InputError: bad JSON, index out of range, duplicate addresses...
    workers = list(cfg.cluster.get("worker", []))
    index = cfg.task_index if cfg.task_type == "worker" else -1
    if not workers:
        raise InputError("cluster.worker is empty", where="TF_CONFIG")
    return workers, index


def _local_devices(task: Optional[int]) -> List[str]:
    """This process's logical GPUs, else CPUs (with TF_CONFIG the remote devices are listed too)."""
    out = []
    for kind in ("GPU", "CPU"):
        for d in tf.config.list_logical_devices(kind):
            spec = tf.DeviceSpec.from_string(d.name)
            if task is None or spec.task is None or spec.task == task:
                out.append(f"/{kind}:{spec.device_index}")
        if out:
            return out
    return out


# ----------------------------------------------------------------------------- strategy
class GroupedHybridTrainer:
    """Grouped hybrid parallelism: a capacity-aware GPipe pipeline per group, gradients all-reduced.

    Not a ``tf.distribute.Strategy`` subclass, on purpose: a Strategy's contract is that every replica runs
    the *same* function on its shard with mirrored variables (``run``, ``extended.call_for_each_replica``,
    Keras building the whole model per replica); here each device runs a *different* stage of the model
    and the micro-batch schedule is the unit of work. It is a trainer with the surface a training script
    uses: ``scope``, ``num_replicas_in_sync`` (the groups), ``experimental_distribute_dataset`` (global
    batches, split inside the step), ``run`` / ``reduce`` (one global value), ``compile`` then
    ``model.fit`` / ``evaluate`` / ``save_weights`` / ``load_weights`` on the user's model. Limits: the
    optimizer state lives in one optimizer clone per group, so ``.keras`` saves and checkpoints of the
    user's model do not carry the optimizer slots; sample weights are not supported.

    Args:
        devices: device names (default: all logical GPUs, else all logical CPUs).
        capacities: relative speed per device (default all 1), or ``"measure"`` to run
            :func:`tf_commopt.tf.profiler.relative_capacities` on the devices.
        num_groups: G, groups formed by :func:`form_groups` (default 1). Ignored if ``groups`` is given.
        groups: explicit groups, lists of indices into ``devices``.
        microbatches: M per group per mini-batch.
        plans: one PartitionPlan per group (layer name -> stage, device_of_stage indexing the group's
            devices in order); default: partitioned with ``method`` (see module docstring).
        method, bandwidth_gbps, seed: passed to :func:`tf_commopt.partition.partition`.
        profile_batch_size: batch size of the cost graph the partitioner reads.
        group_weights: throughput of each group for the batch split (default: from the plans).
        emulate: if True, a device of capacity c runs ``max(capacities) / c`` times slower
            (:mod:`tf_commopt.tf.slowdown`), so one CPU machine shows the capacity effect.
        slowdown: explicit {device: factor} instead of ``emulate``.
        tf_config: one group per TF_CONFIG worker host (this process runs its host's group on its local
            ``devices`` with their ``capacities``; gradients are all-reduced between hosts with collective
            ops). Default: True when TF_CONFIG lists more than one worker. Create the strategy before
            any other TensorFlow op, as with MultiWorkerMirroredStrategy.
        exclusive_devices: run each device's schedule instructions one after another (every op of an
            instruction gets a control dependency on all ops of the device's previous instruction), as a
            GPU stream does; by default only data dependencies order them, so a logical CPU device
            overlaps micro-batches (and emulated slow-down sleeps). For comparing with the simulator.
        overlap, bucket_bytes: the program's gradient buckets and overlap
            (:func:`tf_commopt.core.hybrid.hybrid_program`).
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
        if tf_config is None:  # like TensorFlow's own strategies: a multi-worker TF_CONFIG means multi-host
            tf_config = bool(os.environ.get("TF_CONFIG")) and len(groups_from_tf_config()[0]) > 1
        self.hosts: List[str] = []
        self.task = 0
        self._mw = None
        if tf_config:
            self.hosts, self.task = groups_from_tf_config()
            if self.task < 0:
                raise InputError(
                    "this task is not a worker; every worker host runs one group", where="TF_CONFIG"
                )
            if groups is not None or num_groups not in (None, len(self.hosts)):
                raise InputError(
                    f"with TF_CONFIG there is one group per worker host ({len(self.hosts)}); "
                    "do not pass groups/num_groups",
                    where="GroupedHybridTrainer",
                )
            # MultiWorkerMirroredStrategy starts this host's server and the collective runtime
            self._mw = tf.distribute.MultiWorkerMirroredStrategy()
        self.devices = [
            str(d)
            for d in (devices if devices is not None else _local_devices(self.task if tf_config else None))
        ]
        if not self.devices:
            raise InputError("no devices", where="GroupedHybridTrainer(devices=...)")
        if isinstance(capacities, str):
            if capacities != "measure":
                raise InputError(
                    f"capacities must be a list of numbers or 'measure', got {capacities!r}",
                    where="capacities",
                )
            from tf_commopt.tf.profiler import relative_capacities

            capacities = relative_capacities(self.devices)
        caps = [1.0] * len(self.devices) if capacities is None else [float(c) for c in capacities]
        if len(caps) != len(self.devices) or any(not (c > 0) for c in caps):
            raise InputError(
                f"need one positive capacity per device ({len(self.devices)}), got {capacities!r}",
                where="capacities",
            )
        self.capacities = caps
        if self._mw is not None:
            self.groups = [list(range(len(self.devices)))]  # this host's group: all its devices
        elif groups is not None:
            gs = [list(map(int, g)) for g in groups]
            flat = [i for g in gs for i in g]
            if (
                not gs
                or any(not g for g in gs)
                or sorted(flat) != sorted(set(flat))
                or any(not 0 <= i < len(self.devices) for i in flat)
            ):
                raise InputError(
                    f"groups must be non-empty, disjoint lists of device indices in "
                    f"0..{len(self.devices) - 1}, got {groups!r}",
                    where="groups",
                )
            self.groups = gs
        else:
            self.groups = form_groups(caps, 1 if num_groups is None else num_groups)
        if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
            raise InputError(
                f"microbatches must be a positive integer, got {microbatches!r}", where="microbatches"
            )
        self.microbatches = microbatches
        self.num_groups = len(self.hosts) if self._mw is not None else len(self.groups)
        # global index of each group this process runs (all of them in one process; its own with TF_CONFIG)
        self._global_index = [self.task] if self._mw is not None else list(range(self.num_groups))
        if plans is not None and self._mw is not None and len(plans) == self.num_groups:
            plans = [plans[self.task]]
        if plans is not None and len(plans) != len(self.groups):
            raise InputError(f"{len(plans)} plans for {len(self.groups)} groups", where="plans")
        self.plans: Optional[List[PartitionPlan]] = list(plans) if plans is not None else None
        self.method, self.bandwidth_gbps, self.seed = method, float(bandwidth_gbps), int(seed)
        self.profile_batch_size = int(profile_batch_size)
        if group_weights is not None and len(group_weights) != self.num_groups:
            raise InputError(
                f"{len(group_weights)} group weights for {self.num_groups} groups", where="group_weights"
            )
        self._group_weights = None if group_weights is None else [float(w) for w in group_weights]
        if slowdown is not None:
            self.slowdown = {canonical_device(k): float(v) for k, v in slowdown.items()}
        elif emulate:
            top = max(caps)
            self.slowdown = {canonical_device(d): top / c for d, c in zip(self.devices, caps) if c < top}
        else:
            self.slowdown = {}
        self.exclusive_devices = bool(exclusive_devices)
        self.overlap, self.bucket_bytes = bool(overlap), bucket_bytes
        self.graph: Any = None
        self.program: Optional[HybridProgram] = None
        self.graph_plans: List[PartitionPlan] = []
        self.executed: List[Tuple[int, Any]] = []
        self.pipelines: List[Pipeline] = []
        self.model: Any = None
        self._step_fn: Optional[Callable] = None
        self._stats = {"steps": 0, "compute_s": 0.0}

    # -- set-up
    @contextlib.contextmanager
    def scope(self) -> Iterator["GroupedHybridTrainer"]:
        """Variables created inside (the user's model and optimizer) live on the first device."""
        with tf.device(self.devices[self.groups[0][0]]):
            yield self

    # -- the tf.distribute.Strategy surface a training script uses (see the class docstring for why this
    #    is not a tf.distribute.Strategy subclass)
    @property
    def num_replicas_in_sync(self) -> int:
        """Data-parallel replicas: the groups (each a whole model copy, pipelined over its devices)."""
        return self.num_groups

    def experimental_distribute_dataset(self, dataset: Any) -> Any:
        """The dataset itself: each element is one *global* batch, which the step splits among the groups
        (:meth:`group_batch_sizes`). Its batch size must be static (``drop_remainder=True``)."""
        self._check_static_batches(dataset, None)
        return dataset

    distribute_datasets_from_function = None  # per-replica input pipelines do not fit a split global batch

    def run(self, fn: Callable, args: Sequence[Any] = (), kwargs: Optional[Mapping[str, Any]] = None) -> Any:
        """``fn(*args, **kwargs)`` once, in :meth:`scope`. Use it with :meth:`train_step` /
        :meth:`compute_gradients`, which run all groups inside; the result is already global (one value,
        not per replica), so :meth:`reduce` returns it unchanged."""
        with self.scope():
            return fn(*args, **(kwargs or {}))

    def reduce(self, reduce_op: Any, value: Any, axis: Optional[int] = None) -> Any:
        """``value`` (already global, see :meth:`run`); with ``axis``, summed or averaged over it as
        ``reduce_op`` (``tf.distribute.ReduceOp.SUM`` / ``MEAN``) says."""
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

    def compile(self, model: Any, optimizer: Any, loss: Callable, metrics: Any = None) -> None:
        """Partition ``model`` per group, place a copy of it on each group's devices, clone ``optimizer``
        per group, and make ``model.fit`` run the hybrid step (see :meth:`keras_train_step`).
        """
        from tf_commopt.tf.graph_import import from_keras_model

        self.graph = from_keras_model(model, batch_size=self.profile_batch_size)
        if self.plans is None:
            self.plans = self._partition(model)

        self.model, self.loss = model, loss
        if self._mw is not None:
            self._broadcast_weights(model)
        self.pipelines = []
        for g, plan in enumerate(self.plans):
            devs = self.group_devices(g)
            pipe = Pipeline(
                model,
                plan,
                devices=devs,
                microbatches=self.microbatches,
                loss=loss,
                optimizer=optimizer.__class__.from_config(optimizer.get_config()),
                slowdown=self.slowdown,
                place=True,
            )
            self.pipelines.append(pipe)
        # variable k of every group copy <-> model.trainable_weights[k]
        self._index: List[List[int]] = []
        for pipe in self.pipelines:
            pos = {v.ref(): k for k, v in enumerate(pipe.model.trainable_weights)}
            self._index.append([pos[v.ref()] for v in pipe.trainable_variables])
        import dataclasses

        self.graph_plans = [
            dataclasses.replace(plan, stage_of_node=son)  # every cost-graph node staged
            for plan, son in zip(self.plans, self._stage_maps())
        ]
        self.program = self._make_program()
        self._auto_weights = None
        self.schedule: Schedule = self.program.schedule
        self._order_cache = execution_order(self.schedule)
        if self._mw is not None and self._group_weights is None:
            self._group_weights = self._exchange_weights(self._local_weights())
        model.compile(optimizer=optimizer, loss=loss, metrics=metrics)
        model.train_step = self.keras_train_step
        fit = model.fit

        def fit_from_current_weights(*args: Any, **kwargs: Any) -> Any:
            self._check_static_batches(
                args[0] if args else kwargs.get("x"),
                kwargs.get("batch_size", args[2] if len(args) > 2 else None),
            )
            self.push_model()  # weights loaded or restored after compile are the starting point
            return fit(*args, **kwargs)

        model.fit = fit_from_current_weights
        self._step_fn = None

    def _stage_maps(self) -> List[Dict[str, int]]:
        """Per group: every cost-graph node -> its stage (model inputs, which plans may omit: stage 0)."""
        order = self.graph.topological_order()
        out = []
        for pipe in self.pipelines:
            lay = pipe.layout
            by_call = {name: s for s in range(lay.num_stages) for name in lay.layers_of_stage(s)}
            son = {}
            for v in order:
                top = v.split("/")[0]
                son[v] = by_call.get(v, by_call.get(top, lay.stage_of_layer.get(top, 0)))
            out.append(son)
        return out

    def _make_program(self) -> HybridProgram:
        """The core program of these groups and plans; also each bucket's variables (model indices)."""
        order = self.graph.topological_order()
        prog = hybrid_program(
            order,
            {v: self.graph[v].param_bytes for v in order},
            [p.stage_of_node for p in self.graph_plans],
            self.microbatches,
            self.overlap,
            self.bucket_bytes,
            [p.layout.num_stages for p in self.pipelines],
        )
        pos = {v.ref(): k for k, v in enumerate(self.model.trainable_weights)}
        layer_of = {}
        for layer in self.model.layers:
            layer_of[layer.name] = layer
            for sub in getattr(layer, "layers", []) or []:
                layer_of[f"{layer.name}/{sub.name}"] = sub
        self._bucket_vars: Dict[str, List[int]] = {}
        owned = set()
        for b in prog.buckets:
            ks = []
            for v in b.nodes:
                layer = layer_of.get(v, layer_of.get(v.split("@")[0]))
                for w in layer.trainable_weights if layer is not None else []:
                    k = pos.get(w.ref())
                    if k is not None and k not in owned:
                        owned.add(k)
                        ks.append(k)
            self._bucket_vars[b.key] = ks
        if prog.buckets and len(owned) != len(self.model.trainable_weights):
            from tf_commopt.errors import PlanError

            missing = [
                self.model.trainable_weights[k].name
                for k in range(len(self.model.trainable_weights))
                if k not in owned
            ]
            raise PlanError(
                f"variables {missing[:3]} belong to no gradient bucket (their layer has no "
                "parameters in the cost graph)",
                where="GroupedHybridTrainer",
            )
        return prog

    def _partition(self, model: Any) -> List[PartitionPlan]:
        from tf_commopt.partition import partition
        from tf_commopt.tf.graph_import import from_keras_model

        graph = (
            self.graph
            if self.graph is not None
            else from_keras_model(model, batch_size=self.profile_batch_size)
        )
        return [
            partition(
                graph,
                len(g),
                method=self.method,
                capacities=[self.capacities[i] for i in g],
                bandwidth_gbps=self.bandwidth_gbps,
                seed=self.seed,
            )
            for g in self.groups
        ]

    # -- batch split
    @property
    def group_weights(self) -> List[float]:
        """Throughput of each group used to split the global batch (see module docstring)."""
        if self._group_weights is not None:
            return list(self._group_weights)
        if self._mw is not None:
            raise InputError(
                "call strategy.compile(...) first: the hosts exchange their group throughputs there",
                where="GroupedHybridTrainer",
            )
        if getattr(self, "_auto_weights", None) is None:
            self._auto_weights = self._local_weights()  # simulated once per compile
        return list(self._auto_weights)

    def _local_weights(self) -> List[float]:
        """``1 / t_g`` of the groups this process runs (see module docstring)."""
        if self.graph is None:
            raise InputError(
                "call strategy.compile(...) first: the batch split needs the model's cost graph",
                where="GroupedHybridTrainer",
            )
        from tf_commopt.core.devices import Cluster
        from tf_commopt.core.simulate.hybrid import group_alone_ms

        cl = Cluster.from_capacities(self.capacities, self.bandwidth_gbps)
        return [
            1.0 / group_alone_ms(self.graph, cl, grp, plan, self.microbatches)
            for grp, plan in zip(self.groups, self.graph_plans)
        ]

    def group_batch_sizes(self, batch: int) -> List[int]:
        """Samples of a global batch of ``batch`` that each group trains on."""
        return split_batch(batch, self.group_weights)

    # -- training
    def compute_gradients(self, x: Any, y: Any) -> Tuple[tf.Tensor, List[List[tf.Tensor]]]:
        """Run the combined schedule up to the all-reduce: (global mean loss, reduced grads per group)."""
        if not self.pipelines:
            raise InputError(
                "call strategy.compile(model, optimizer, loss) first", where="GroupedHybridTrainer"
            )
        B = self.pipelines[0]._batch_of(x)
        sizes = self.group_batch_sizes(B)
        xs, ys = Pipeline._split(x, sizes), Pipeline._split(y, sizes)
        runs = [p.begin(xs[gi], ys[gi], total_batch=B) for gi, p in zip(self._global_index, self.pipelines)]
        for p, run in zip(self.pipelines, runs):
            if run.num_microbatches != self.microbatches:
                raise InputError(
                    f"a group got {sizes} samples, fewer than its {self.microbatches} micro-batches; "
                    "use a larger batch or fewer micro-batches",
                    where="GroupedHybridTrainer",
                )
        prog = self.program
        assert prog is not None
        sums: Dict[int, List[tf.Tensor]] = {}  # model variable index -> reduced gradient per group
        done: Dict[str, Any] = {}
        executed = []
        for r, ins in self._order():
            role = prog.roles[r]
            g, s = role.group, role.stage
            executed.append((r, ins))
            if isinstance(ins, AllReduce):
                if ins.key not in self._reduced_keys(sums):
                    sums.update(self._all_reduce_bucket(ins.key, runs))
            elif isinstance(ins, OptimizerStep):
                continue
            elif role.piece > 0:
                continue  # a part of stage s's last backward, which the stage rank runs as one call
            elif self.exclusive_devices and not tf.executing_eagerly():
                self._execute_exclusive(runs[g], s, ins, self.pipelines[g].layout.devices[s], done)
            else:
                runs[g].execute(s, ins)
        self.executed = executed
        self._last_runs = runs
        loss = tf.add_n([tf.identity(run.result()[0]) for run in runs])
        reduced = []
        for g, run in enumerate(runs):
            own = run.result()[1]
            reduced.append([sums[k][g] if k in sums else own[j] for j, k in enumerate(self._index[g])])
        if self._mw is not None:
            loss, reduced = self._all_reduce_hosts(loss, reduced)
        return loss, reduced

    def _reduced_keys(self, sums: Dict[int, List[tf.Tensor]]) -> set:
        return {key for key, ks in self._bucket_vars.items() if ks and all(k in sums for k in ks)}

    def _all_reduce_bucket(self, key: str, runs: List[Any]) -> Dict[int, List[tf.Tensor]]:
        """Bucket ``key`` as one fused all-reduce (as the simulator charges it): each group's gradients of
        the bucket's variables flattened into one vector, the vectors summed in group order on every
        holder's device (bit-identical copies), split back per variable."""
        ks = self._bucket_vars[key]
        if not ks:
            return {}
        flats, holders = [], []
        for g, (pipe, run) in enumerate(zip(self.pipelines, runs)):
            vs = [pipe.trainable_variables[self._index[g].index(k)] for k in ks]
            holders.append(vs)
            parts = [run.acc.get(v.ref()) for v in vs]
            parts = [p if p is not None else tf.zeros_like(v) for p, v in zip(parts, vs)]
            with tf.device(vs[0].device):
                flats.append(
                    tf.concat([tf.reshape(p, [-1]) for p in parts], 0)
                    if len(parts) > 1
                    else tf.reshape(parts[0], [-1])
                )
        out: Dict[int, List[tf.Tensor]] = {k: [] for k in ks}
        for vs in holders:
            with tf.device(vs[0].device):
                fl = [tf.identity(f) for f in flats]
                tot = tf.add_n(fl) if len(fl) > 1 else fl[0]
                sizes = [int(v.shape.num_elements()) for v in vs]
                pieces = tf.split(tot, sizes) if len(vs) > 1 else [tot]
                for k, v, piece in zip(ks, vs, pieces):
                    out[k].append(tf.reshape(piece, v.shape))
        return out

    @staticmethod
    def _execute_exclusive(run: Any, s: int, ins: Any, device: str, done: Dict[str, Any]) -> None:
        """``run.execute(s, ins)`` after everything the device did before (see ``exclusive_devices``)."""
        graph = tf.compat.v1.get_default_graph()
        before = len(graph.get_operations())
        with tf.control_dependencies([done[device]] if device in done else []):
            run.execute(s, ins)
        new = graph.get_operations()[before:]
        if new:
            done[device] = tf.group(*new)

    def _order(self) -> List[Tuple[int, Any]]:
        return self._order_cache

    def _step(self, x: Any, y: Any) -> tf.Tensor:
        loss, reduced = self.compute_gradients(x, y)
        for pipe, grads in zip(self.pipelines, reduced):
            pipe.apply_gradients(grads)
        return loss

    def train_step(self, x: Any, y: Any) -> tf.Tensor:
        """One global mini-batch (all groups, all-reduce, one step per group) inside one ``tf.function``."""
        if self._step_fn is None:
            self._step_fn = tf.function(self._step)
        t0 = time.perf_counter()
        loss = self._step_fn(x, y)
        loss = float(loss)  # waits for the step
        self._stats["compute_s"] += time.perf_counter() - t0
        self._stats["steps"] += 1
        return loss

    def fit(
        self, dataset: Any, epochs: int = 1, steps_per_epoch: Optional[int] = None
    ) -> Dict[str, List[float]]:
        """Train on ``(x, y)`` batches (a tf.data.Dataset or any iterable) for ``epochs``, starting from the
        user's model's current weights (so ``load_weights`` / a checkpoint restore is honoured); copies the
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

    def keras_train_step(self, data: Any) -> Dict[str, tf.Tensor]:
        """``model.train_step`` replacement used by ``model.fit``: the hybrid step, then the user's model
        gets group 0's weights (so evaluate/predict/save see the trained model); the compiled loss and
        metrics are computed on the step's own predictions (the pipelines' outputs, groups in batch
        order). Batches need a static size: a dataset batched without ``drop_remainder=True`` is a
        one-line InputError."""
        import tf_keras as keras

        x, y, sw = keras.utils.unpack_x_y_sample_weight(data)
        first = tf.nest.flatten(x)[0]
        if first.shape.rank is None or first.shape[0] is None:
            raise InputError(
                "the batch size must be static: batch the dataset with "
                "dataset.batch(B, drop_remainder=True) (a partial last batch cannot be split into "
                "the groups' fixed micro-batches)",
                where="GroupedHybridTrainer model.fit",
            )
        if sw is not None:
            raise InputError("sample weights are not supported", where="GroupedHybridTrainer model.fit")
        loss = self._step(x, y)
        self._assign_model(tf.identity)
        flat = [
            tf.concat([tf.identity(run.predictions()[k]) for run in self._last_runs], 0)
            if len(self._last_runs) > 1
            else self._last_runs[0].predictions()[k]
            for k in range(len(self._last_runs[0].predictions()))
        ]
        y_pred = tf.nest.pack_sequence_as(keras_nested_outputs(self.model), flat)
        self.model.compute_loss(x, y, y_pred, None)  # the loss tracker: the batch's mean loss, as the step's
        return self.model.compute_metrics(x, y, y_pred, None)

    @staticmethod
    def _check_static_batches(x: Any, batch_size: Optional[int]) -> None:
        """One-line InputError before ``model.fit`` traces if a batch could be partial."""
        msg = (
            "batches need a static size: use dataset.batch(B, drop_remainder=True) (a partial last batch "
            "cannot be split into the groups' fixed micro-batches)"
        )
        if isinstance(x, tf.data.Dataset):
            spec = tf.nest.flatten(x.element_spec)[0]
            if spec.shape.rank is None or spec.shape[0] is None:
                raise InputError(msg, where="GroupedHybridTrainer model.fit")
        elif x is not None and hasattr(tf.nest.flatten(x)[0], "shape"):
            n, b = int(tf.nest.flatten(x)[0].shape[0]), int(batch_size or 32)
            if n % b:
                raise InputError(
                    f"{n} samples leave a partial last batch of {n % b} with batch_size={b}; " + msg,
                    where="GroupedHybridTrainer model.fit",
                )

    def push_model(self) -> None:
        """Copy the user's model's weights into every group's copy (after ``load_weights`` or a restore)."""
        if not self.pipelines:
            return
        src = self.model.weights
        for pipe in self.pipelines:
            for v, w in zip(pipe.model.weights, src):
                v.assign(w)

    def sync_model(self) -> None:
        """Copy group 0's weights into the user's model (all groups hold identical weights)."""
        self._assign_model(lambda t: t)

    def _assign_model(self, wrap: Callable) -> None:
        src = self.pipelines[0].model.weights
        for v, w in zip(self.model.weights, src):
            v.assign(wrap(w))

    # -- multi-host (TF_CONFIG): collective ops between the worker hosts
    _made = 0

    def _collective_sum(self, flat: tf.Tensor, instance: int) -> tf.Tensor:
        """Sum of ``flat`` over all hosts (one CollectiveReduceV2 on this host's first CPU)."""
        if not hasattr(self, "_group_key"):
            GroupedHybridTrainer._made += 1  # the same sequence on every host: same keys
            self._group_key = 7_000_000 + 1_000 * GroupedHybridTrainer._made
        with tf.device("/CPU:0"):
            return tf.raw_ops.CollectiveReduceV2(
                input=tf.identity(flat),
                group_size=len(self.hosts),
                group_key=self._group_key,
                instance_key=self._group_key + instance,
                ordering_token=[],
                merge_op="Add",
                final_op="Id",
            )

    def _broadcast_weights(self, model: Any) -> None:
        """Every host starts from host 0's weights (sum of host 0's values and zeros elsewhere: exact)."""
        ws = model.weights
        flat = tf.concat([tf.reshape(tf.cast(w, tf.float32), [-1]) for w in ws], 0)
        got = tf.function(lambda f: self._collective_sum(f, 1))(flat * (1.0 if self.task == 0 else 0.0))
        off = 0
        for w in ws:
            n = int(tf.size(w))
            w.assign(tf.cast(tf.reshape(got[off : off + n], w.shape), w.dtype))
            off += n

    def _exchange_weights(self, local: List[float]) -> List[float]:
        vec = [0.0] * len(self.hosts)
        vec[self.task] = float(local[0])
        return [float(v) for v in tf.function(lambda f: self._collective_sum(f, 2))(tf.constant(vec)).numpy()]

    def _all_reduce_hosts(
        self, loss: tf.Tensor, grads: List[List[tf.Tensor]]
    ) -> Tuple[tf.Tensor, List[List[tf.Tensor]]]:
        """Sum this host's group gradients (and loss) with the other hosts' in one collective."""
        pipe, g = self.pipelines[0], grads[0]
        with tf.device("/CPU:0"):
            flat = tf.concat([tf.reshape(t, [-1]) for t in g] + [tf.reshape(loss, [1])], 0)
        tot = self._collective_sum(flat, 3)
        out, off = [], 0
        for t, v in zip(g, pipe.trainable_variables):
            n = t.shape.num_elements()
            with tf.device(v.device):
                out.append(tf.reshape(tot[off : off + n], t.shape))
            off += n
        return tot[off], [out]

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


GroupedHybridStrategy = GroupedHybridTrainer
"""The former name (it is a trainer with a strategy's surface, not a ``tf.distribute.Strategy``: see the
class docstring); kept as an alias for one release."""
