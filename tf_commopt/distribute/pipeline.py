"""Run a PartitionPlan for real: stage sub-models on devices, GPipe micro-batches, one optimizer step.

Example:
    >>> import os; os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # doctest: +SKIP
    >>> import tf_keras as keras
    >>> from tf_commopt.core.plan import PartitionPlan
    >>> from tf_commopt.distribute.pipeline import Pipeline
    >>> x = keras.Input((8,)); h = keras.layers.Dense(16, name="a")(x)
    >>> y = keras.layers.Dense(2, name="b")(keras.layers.Add(name="c")([h, keras.layers.Dense(16, name="d")(h)]))
    >>> model = keras.Model(x, y)
    >>> plan = PartitionPlan.from_dict({"method": "hand", "stage_of_node": {"a": 0, "d": 1, "c": 1, "dense": 1},
    ...     "device_of_stage": [0, 1], "stage_compute_ms": [0, 0], "stage_comm_ms": [0, 0],
    ...     "stage_memory_bytes": [0, 0], "objective": 0, "comm_bytes": 0})          # doctest: +SKIP
    >>> pipe = Pipeline(model, plan, devices=["/CPU:0", "/CPU:1"], microbatches=4,
    ...                 loss=keras.losses.MeanSquaredError(), optimizer=keras.optimizers.SGD(0.1))  # doctest: +SKIP
    >>> loss = pipe.train_step(x_batch, y_batch)                                       # doctest: +SKIP

How it works (GPipe, Huang et al., "GPipe: Efficient Training of Giant Neural Networks using Pipeline
Parallelism", NeurIPS 2019):

* The plan maps every layer name of a functional or Sequential tf-keras model to a stage. Layers run in
  the order of the model's own graph; a stage is the set of its layers' calls, executed under
  ``tf.device(stage device)``. A tensor produced in stage i and consumed in stage j > i (a skip
  connection or a branch) is sent straight to stage j (``tf.identity`` under stage j's device: in one
  process that is TensorFlow's cross-device copy). Stages must follow the data flow: an edge from a later
  stage to an earlier one is a :class:`~tf_commopt.errors.PlanError` naming both layers.
* A mini-batch of B samples is split into M micro-batches of sizes b_m (sizes differ by at most one).
  Forward: for m = 0..M-1, for s = 0..P-1, stage s runs micro-batch m under a ``tf.GradientTape``.
  Backward: for m = 0..M-1, for s = P-1..0, the tape of (s, m) gives the gradients of the stage's
  inputs and variables from the gradients of its outputs. The exact rule: the micro-batch loss is
  ``loss(y_m, f(x_m)) * b_m / B_total`` (B_total = B, or the global batch under the hybrid strategy), so
  the accumulated gradient ``sum_m grad(loss_m * b_m / B)`` equals the gradient of the mini-batch mean loss
  for any loss that averages over samples (every Keras loss with the default reduction).
  One ``optimizer.apply_gradients`` per mini-batch.
* The order of work is the shared GPipe schedule (:func:`tf_commopt.core.schedule.gpipe`, one stream
  per stage), interleaved by :func:`tf_commopt.core.schedule.order.execution_order` so that every
  receive follows its send. Inside the
  ``tf.function`` the order fixes only the data dependencies:
  TensorFlow runs independent stages concurrently, which is what fills the pipeline.

Not exact under micro-batching (as in every GPipe implementation): BatchNormalization statistics are
per micro-batch, and random layers (Dropout) draw different masks. Regularisation losses
(``model.losses``) are not added.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from tf_commopt import use_tf_keras

use_tf_keras()  # before TensorFlow loads: tf.keras is tf-keras
import tensorflow as tf

from tf_commopt._compat import keras_nested_outputs
from tf_commopt.core.plan import PartitionPlan
from tf_commopt.core.schedule import Backward, Forward, OptimizerStep, gpipe
from tf_commopt.core.schedule.order import KNOWN, execution_order
from tf_commopt.distribute.stages import (  # re-exported
    StageLayout,
    _is_float,
    default_devices,
    place_model,
    split_sizes,
)
from tf_commopt.errors import InputError, PlanError
from tf_commopt.tf.slowdown import canonical_device, get_slowdown, slowed

__all__ = ["Pipeline", "MiniBatchRun", "StageLayout", "split_sizes", "place_model", "default_devices"]


# ----------------------------------------------------------------------------- slow-down
def _slowed(factor: float, fn: Callable[[], Any], inputs: Sequence[tf.Tensor]) -> Any:
    """``fn()`` on a device emulated ``factor`` times slower (:func:`tf_commopt.tf.slowdown.slowed`:
    sleep ``(factor - 1)`` x the measured time after the work, ordered after ``inputs``)."""
    if factor <= 1.0:
        return fn()
    return slowed(lambda *_: fn(), factor)(*inputs)


# ----------------------------------------------------------------------------- pipeline
class Pipeline:
    """GPipe training of a tf-keras model split by a PartitionPlan.

    Example:
        >>> pipe = Pipeline(model, plan, devices=["/GPU:0", "/GPU:1"], microbatches=4,
        ...                 loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        ...                 optimizer=keras.optimizers.SGD(0.1))                   # doctest: +SKIP
        >>> for x, y in dataset: pipe.train_step(x, y)                              # doctest: +SKIP

    Args:
        model: functional or Sequential tf-keras model; its own variables are trained (use
            :func:`place_model` or ``place=True`` to first move each layer's variables to its stage device).
        plan: :class:`PartitionPlan` whose ``stage_of_node`` maps layer names to stages.
        devices: device names indexed by ``plan.device_of_stage`` (default: :func:`default_devices`).
        microbatches: M, micro-batches per mini-batch.
        loss: ``loss(y_true, y_pred) -> scalar`` averaging over samples (e.g. a Keras loss).
        optimizer: a tf-keras optimizer (needed for :meth:`train_step`).
        slowdown: optional {device name: factor >= 1}: emulate a device that many times slower
            (default: the registry of :func:`tf_commopt.tf.slowdown.set_slowdown`).
        place: clone the model with each stage's variables on its device (weights copied).
    """

    def __init__(
        self,
        model: Any,
        plan: PartitionPlan,
        devices: Optional[Sequence[str]] = None,
        microbatches: int = 1,
        loss: Optional[Callable] = None,
        optimizer: Any = None,
        slowdown: Optional[Mapping[str, float]] = None,
        place: bool = False,
    ):
        if not isinstance(microbatches, int) or microbatches < 1:
            raise InputError(
                f"microbatches must be a positive integer, got {microbatches!r}", where="Pipeline"
            )
        devices = list(devices) if devices is not None else default_devices()
        if place:
            probe = StageLayout(model, plan, devices)  # validates before cloning
            dev_of_layer = {name: probe.devices[s] for name, s in probe.stage_of_layer.items()}
            model = place_model(model, dev_of_layer, probe.devices[0])
        self.layout = StageLayout(model, plan, devices)
        self.model = model
        self.microbatches = microbatches
        self.loss = loss
        self.optimizer = optimizer
        self.slowdown = {canonical_device(str(k)): float(v) for k, v in (slowdown or {}).items()}
        for k, v in self.slowdown.items():
            if not v >= 1.0:
                raise InputError(f"slow-down factor of {k} must be >= 1, got {v}", where="slowdown")
        self.schedule = gpipe(self.layout.num_stages, microbatches)
        self._orders: Dict[int, List[Tuple[int, Any]]] = {microbatches: execution_order(self.schedule)}
        self._train_fn = None

    # -- accessors
    @property
    def trainable_variables(self) -> List[tf.Variable]:
        """All trained variables, stage by stage, each once (the order of :meth:`compute_gradients`' result)."""
        out, seen = [], set()
        for vs in self.layout.variables_of_stage:
            for v in vs:
                if v.ref() not in seen:
                    seen.add(v.ref())
                    out.append(v)
        return out

    @property
    def stage_devices(self) -> List[str]:
        return list(self.layout.devices)

    def _factor(self, s: int) -> float:
        """Slow-down factor of stage ``s``'s device: ``slowdown=`` if given there, else the process-wide
        registry of :mod:`tf_commopt.tf.slowdown` (``set_slowdown``), else 1."""
        dev = canonical_device(self.layout.devices[s])
        if dev in self.slowdown:
            return self.slowdown[dev]
        return get_slowdown(dev)

    # -- forward only
    def predict_step(self, x: Any) -> Any:
        """Pipelined forward pass (training=False) of one batch, micro-batched; returns the model output."""
        outs = []
        for xm in self._split(x, split_sizes(self._batch_of(x), self.microbatches)):
            acts = self._feed(xm)
            for s in range(self.layout.num_stages):
                acts.update(self._forward(s, acts, training=False, tape=None)[1])
            outs.append(self._outputs(acts))
        cat = [tf.concat(list(parts), axis=0) for parts in zip(*[tf.nest.flatten(o) for o in outs])]
        return tf.nest.pack_sequence_as(keras_nested_outputs(self.model), cat)

    # -- training
    def begin(self, x: Any, y: Any, total_batch: Optional[int] = None) -> "MiniBatchRun":
        """Start one mini-batch; drive it with ``run.forward(s, m)`` / ``run.backward(s, m)``."""
        return MiniBatchRun(self, x, y, total_batch)

    def compute_gradients(
        self, x: Any, y: Any, total_batch: Optional[int] = None
    ) -> Tuple[tf.Tensor, List[tf.Tensor]]:
        """GPipe forward+backward of one mini-batch: (weighted loss, gradients of :attr:`trainable_variables`).

        Each micro-batch loss is weighted by ``b_m / total_batch`` (default: this batch's size), so the
        result is the gradient of the mini-batch mean loss (or this batch's share of a global one).
        """
        run = self.begin(x, y, total_batch)
        for s, ins in self.order(run.num_microbatches):
            run.execute(s, ins)
        return run.result()

    def order(self, microbatches: int) -> List[Tuple[int, Any]]:
        """The executed order of the GPipe schedule with ``microbatches`` micro-batches (cached)."""
        if microbatches not in self._orders:
            self._orders[microbatches] = execution_order(gpipe(self.layout.num_stages, microbatches))
        return self._orders[microbatches]

    def train_step(self, x: Any, y: Any) -> tf.Tensor:
        """One mini-batch: the GPipe schedule, ending in one optimizer step. Runs inside one ``tf.function``."""
        if self.optimizer is None:
            raise InputError("Pipeline needs an optimizer to train", where="Pipeline(optimizer=...)")
        if self._train_fn is None:

            def step(x, y):
                run = self.begin(x, y)
                issued = 0
                for s, ins in self.order(run.num_microbatches):
                    if isinstance(ins, OptimizerStep):
                        issued += 1  # every stage issues one; the last one (all backwards done) steps
                        if issued == self.layout.num_stages:  # one tf-keras step updates all stages
                            self.apply_gradients(run.result()[1])
                    else:
                        run.execute(s, ins)
                return run.result()[0]

            self._train_fn = tf.function(step)
        return self._train_fn(x, y)

    def apply_gradients(self, grads: Sequence[tf.Tensor]) -> None:
        """One optimizer step of all stages (each variable's update runs on its own device)."""
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))

    # -- internals
    def _batch_of(self, x: Any) -> int:
        first = tf.nest.flatten(x)[0]
        b = first.shape[0]
        if b is None:
            raise InputError(
                "the batch dimension must be static (call inside tf.function with fixed "
                "batch shapes, or eagerly)",
                where="Pipeline",
            )
        return int(b)

    @staticmethod
    def _split(x: Any, sizes: List[int]) -> List[Any]:
        flat = [
            tf.split(tf.convert_to_tensor(t), sizes, axis=0) if len(sizes) > 1 else [tf.convert_to_tensor(t)]
            for t in tf.nest.flatten(x)
        ]
        return [tf.nest.pack_sequence_as(x, [parts[m] for parts in flat]) for m in range(len(sizes))]

    def _feed(self, xm: Any) -> Dict[str, tf.Tensor]:
        flat = tf.nest.flatten(xm)
        if len(flat) != len(self.layout.input_ids):
            raise InputError(
                f"model {self.model.name!r} takes {len(self.layout.input_ids)} inputs, got {len(flat)}",
                where="Pipeline",
            )
        out = {}
        for tid, t, ref in zip(self.layout.input_ids, flat, self.model.inputs):
            out[tid] = tf.cast(t, ref.dtype) if t.dtype != ref.dtype else t
        return out

    def _forward(
        self, s: int, acts: Mapping[str, tf.Tensor], training: bool, tape: Optional[tf.GradientTape]
    ) -> Tuple[Dict[str, tf.Tensor], Dict[str, tf.Tensor]]:
        """Stage ``s`` on its device: receive its inputs, run its layers; returns (inputs, outputs)."""
        L = self.layout
        with tf.device(L.devices[s]):
            ins = {t: tf.identity(acts[t]) for t in L.stage_inputs[s]}  # Recv (cross-device copy)

            def run():
                return L.run_stage(s, ins, training)

            if tape is None:
                out = _slowed(self._factor(s), run, list(ins.values()))
            else:
                with tape:
                    for t in ins.values():
                        if _is_float(t):
                            tape.watch(t)
                    out = _slowed(self._factor(s), run, list(ins.values()))
        return ins, out

    def _backward(
        self,
        s: int,
        tape: tf.GradientTape,
        ins: Mapping[str, tf.Tensor],
        outs: Mapping[str, tf.Tensor],
        grad_of: Dict[str, tf.Tensor],
        acc: Dict[Any, tf.Tensor],
    ):
        L = self.layout
        vs = L.variables_of_stage[s]
        with tf.device(L.devices[s]):

            def run():
                tgt = [(t, v) for t, v in outs.items() if _is_float(v)]
                targets = [v for _, v in tgt]
                out_grads = [grad_of[t] if t in grad_of else tf.zeros_like(v) for t, v in tgt]
                src_ids = [t for t, v in ins.items() if _is_float(v) and L.producer[t] >= 0]
                sources = [ins[t] for t in src_ids] + list(vs)
                if not targets or not sources:
                    return [], []
                g = tape.gradient(
                    targets,
                    sources,
                    output_gradients=out_grads,
                    unconnected_gradients=tf.UnconnectedGradients.ZERO,
                )
                return list(zip(src_ids, g[: len(src_ids)])), g[len(src_ids) :]

            gin, gvars = _slowed(self._factor(s), run, [grad_of[t] for t in outs if t in grad_of])
        for t, g in gin:
            self._add_grad(grad_of, t, g)
        for v, g in zip(vs, gvars):
            acc[v.ref()] = g if v.ref() not in acc else acc[v.ref()] + g

    @staticmethod
    def _add_grad(d: Dict[str, tf.Tensor], t: str, g: tf.Tensor) -> None:
        d[t] = g if t not in d else d[t] + g

    def _outputs(self, acts: Mapping[str, tf.Tensor]) -> Any:
        with tf.device(self.layout.devices[-1]):
            preds = [tf.identity(acts[t]) for t in self.layout.output_ids]
        return tf.nest.pack_sequence_as(keras_nested_outputs(self.model), preds)


class MiniBatchRun:
    """The state of one mini-batch on one pipeline: activations, tapes and gradients per micro-batch.

    Example:
        >>> run = pipe.begin(x, y)                                   # doctest: +SKIP
        >>> for s, ins in pipe.order(run.num_microbatches): run.execute(s, ins)   # doctest: +SKIP
        >>> loss, grads = run.result()                               # doctest: +SKIP
    """

    def __init__(self, pipe: Pipeline, x: Any, y: Any, total_batch: Optional[int] = None):
        if pipe.loss is None:
            raise InputError("Pipeline needs a loss to train", where="Pipeline(loss=...)")
        self.pipe = pipe
        B = pipe._batch_of(x)
        self.total = float(total_batch if total_batch is not None else B)
        self.sizes = split_sizes(B, pipe.microbatches)
        self.xs, self.ys = pipe._split(x, self.sizes), pipe._split(y, self.sizes)
        M = len(self.sizes)
        self.acts: List[Dict[str, tf.Tensor]] = [dict() for _ in range(M)]
        self.tapes: Dict[
            Tuple[int, int], Tuple[tf.GradientTape, Dict[str, tf.Tensor], Dict[str, tf.Tensor]]
        ] = {}
        self.grad_of: List[Dict[str, tf.Tensor]] = [dict() for _ in range(M)]
        self.acc: Dict[Any, tf.Tensor] = {}
        self.losses: List[tf.Tensor] = []
        self.outputs: Dict[int, List[tf.Tensor]] = {}  # micro-batch -> the model's flattened outputs

    @property
    def num_microbatches(self) -> int:
        return len(self.sizes)

    def execute(self, s: int, ins: Any) -> None:
        """Run one instruction of stage ``s``: Forward/Backward compute; Send/Recv are implied by the data
        flow (the consumer copies under its device); OptimizerStep/AllReduce belong to the caller."""
        if isinstance(ins, Forward):
            self.forward(s, ins.mb)
        elif isinstance(ins, Backward):
            self.backward(s, ins.mb)
        elif not isinstance(ins, KNOWN):
            raise PlanError(f"unknown instruction {ins!r}", where=f"pipeline stage {s}")

    def forward(self, s: int, m: int) -> None:
        pipe, L = self.pipe, self.pipe.layout
        if s == 0:
            self.acts[m].update(pipe._feed(self.xs[m]))
        tape = tf.GradientTape(persistent=False)
        ins_t, out = pipe._forward(s, self.acts[m], training=True, tape=tape)
        self.tapes[(s, m)] = (tape, ins_t, out)
        self.acts[m].update(out)
        if s == L.num_stages - 1:  # the loss rides on the last stage's device
            with tf.device(L.devices[-1]):
                with tf.GradientTape() as lt:
                    preds = [tf.identity(self.acts[m][t]) for t in L.output_ids]
                    self.outputs[m] = preds
                    lt.watch(preds)
                    lm = pipe.loss(
                        self.ys[m], tf.nest.pack_sequence_as(keras_nested_outputs(pipe.model), preds)
                    )
                    lm = tf.cast(lm, tf.float32) * (self.sizes[m] / self.total)
                gp = lt.gradient(lm, preds, unconnected_gradients=tf.UnconnectedGradients.ZERO)
            for t, g in zip(L.output_ids, gp):
                pipe._add_grad(self.grad_of[m], t, g)
            self.losses.append(lm)

    def backward(self, s: int, m: int) -> None:
        tape, ins_t, outs_t = self.tapes.pop((s, m))
        self.pipe._backward(s, tape, ins_t, outs_t, self.grad_of[m], self.acc)

    def predictions(self) -> List[tf.Tensor]:
        """The model's flattened outputs for this mini-batch (micro-batches concatenated in order)."""
        M = self.num_microbatches
        return [
            tf.concat([self.outputs[m][k] for m in range(M)], 0) if M > 1 else self.outputs[0][k]
            for k in range(len(self.outputs[0]))
        ]

    def result(self) -> Tuple[tf.Tensor, List[tf.Tensor]]:
        """(sum of the weighted micro-batch losses, accumulated gradients of ``pipe.trainable_variables``)."""
        vs = self.pipe.trainable_variables
        grads = [self.acc.get(v.ref()) for v in vs]
        grads = [g if g is not None else tf.zeros_like(v) for g, v in zip(grads, vs)]
        return tf.add_n(self.losses), grads
