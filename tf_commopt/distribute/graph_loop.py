"""Between two syncs, no Python: under a SkipCorrectStrategy ``model.fit`` runs the local steps up to the
next scheduled sync as one call of one traced function (``SkipCorrectStrategy(graph_loop=True)``, the
default).

Nothing leaves the graph between two syncs (the local steps run no collective and the sync decision is
taken in the graph, step by step), so tf-keras's per-step Python path — the call of the train function,
the callbacks, the progress bar — is paid once per interval instead of once per step. The mechanism is
tf-keras's own ``steps_per_execution``: a model compiled with the default ``steps_per_execution=1`` gets,
for the time of ``fit``,

* ``model.train_function`` = a loop (``tf.while_loop``) of tf-keras's own single-step train function
  (traced once, called from the loop: ``train_step``, metrics and ``_train_counter`` as tf-keras has them),
  running ``model.steps_per_execution`` steps per call;
* ``model.steps_per_execution`` = the steps to the next scheduled sync (:func:`steps_to_next_sync`),
  re-read after every call, so every call ends with a sync and callbacks' ``on_train_batch_end`` sees the
  state right after it (``batch`` is the call's last step, tf-keras's ``steps_per_execution`` rule).

The step's variables (optimizer slots, the correction state, and the compiled loss and metrics, built
from the data's spec) are created before the first trace when the model uses tf-keras's standard
``train_step`` and has static outputs, so tf.function traces the step once instead of twice (plain
tf-keras traces it twice: its metrics are built in the first trace).
The user's ``steps_per_execution`` is restored when ``fit`` returns.

Not used (one step per call, as before) when the model was compiled with another ``steps_per_execution``
(or ``"auto"``), runs eagerly, overrides ``make_train_function``, when a ``BackupAndRestore`` callback
backs up every N *calls* (an integer ``save_freq``), or when a callback says it must run after every step
(an attribute ``needs_every_step`` that is true: ``SkipCorrectTelemetry`` with an ``interval_policy``).
A callback with a method ``steps_to_next_stop()`` (steps from now to where it must see a call end, ≥ 1)
shortens the calls to end there too.

Example:
    >>> strategy = SkipCorrectStrategy(interval=16)               # graph_loop=True   # doctest: +SKIP
    >>> with strategy.scope():                                    # doctest: +SKIP
    ...     model = make_model(); model.compile("sgd", "mse")
    >>> model.fit(x, y, epochs=1)          # one traced call per 16 steps             # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import tensorflow as tf

from tf_commopt import _compat

__all__ = ["steps_to_next_sync", "GraphLoop"]

_LOOP = "_tf_commopt_graph_loop"  # instance attribute: the loop function installed on a model


def steps_to_next_sync(t: int, k: int, h: int, warmup_steps: int) -> int:
    """Steps from now to the next scheduled sync, that step included (≥ 1): one graph-loop call.

    Args:
        t: steps done (the optimizer's ``iterations``).
        k: local steps since the last scheduled sync.
        h: the interval H of the coming steps.
        warmup_steps: the strategy's synchronous steps before local steps begin (every one all-reduces,
            so a call ends where they end).

    >>> steps_to_next_sync(t=0, k=0, h=16, warmup_steps=0), steps_to_next_sync(t=21, k=5, h=16, warmup_steps=0)
    (16, 11)
    >>> steps_to_next_sync(t=1, k=0, h=16, warmup_steps=3)
    2
    """
    if t < warmup_steps:
        return warmup_steps - t
    return max(1, int(h) - int(k))


def _zeros_like_spec(outputs: Any) -> Optional[Any]:
    """Zeros shaped like the (symbolic) ``outputs`` of the step, or None when a shape is not static."""
    flat = tf.nest.flatten(outputs)
    if not all(isinstance(t, (tf.Tensor, tf.TensorSpec)) and t.shape.is_fully_defined() for t in flat):
        return None
    return tf.nest.pack_sequence_as(outputs, [tf.zeros(t.shape, t.dtype) for t in flat])


def _loop_function(step: Any, steps_var: Any, before_trace: Any = None, idle: Any = None) -> Any:
    """``steps_var`` steps of the traced single-step function ``step`` per call (the last step's logs).

    The step is traced once and appears once in the graph (placing and optimizing the call's graph is
    part of the first call): the loop's initial logs are zeros shaped like the step's outputs; a step
    whose outputs have no static shape runs once before the loop instead.

    ``idle`` (period="time"): ``(begin, now, skip)``: ``begin(logs)`` starts the call (returns ``logs``),
    ``now()`` says whether no local replica works at this step, ``skip(logs, flag)`` counts the step
    without running it when ``flag`` and returns ``logs``. Every worker runs the same number of loop iterations (a collective's rendezvous is keyed by
    its loop iteration, and the call's last step syncs), each either the step or, on a worker idle there,
    only its count — but the call's last step always runs (undone on idle replicas), so its logs are a
    step's. The step appears once in the graph."""

    def train_function(iterator: Any) -> Any:
        n = tf.cast(steps_var.read_value(), tf.int32)
        # one trace of the step, called as that concrete function: calling the tf.function itself inside
        # the loop's body graph (another outer graph, another cache key) would trace the step again
        concrete = step.get_concrete_function(iterator)
        init = _zeros_like_spec(concrete.structured_outputs)
        start = tf.constant(0)
        if init is None:
            init, start = concrete(iterator), tf.constant(1)
        if idle is not None:
            init = idle[0](init)

        def body(i: tf.Tensor, logs: Any) -> Any:
            if idle is None:
                return i + 1, concrete(iterator)
            _, now, skip = idle
            idle_here = tf.logical_and(i < n - 1, now())  # the call's last step runs: its logs are the call's
            # a loop of 0 or 1 steps, not a tf.cond: the step's collectives take their instance keys as
            # call-time captures, which a cond branch does not lift (a while body does)
            runs = 1 - tf.cast(idle_here, tf.int32)
            _, logs = tf.while_loop(
                lambda j, _: j < runs, lambda j, _: (j + 1, concrete(iterator)), (0, skip(logs, idle_here))
            )
            return i + 1, logs

        _, outputs = tf.while_loop(lambda i, _: i < n, body, (start, init), parallel_iterations=1)
        return outputs

    return _LoopFunction(tf.function(train_function, autograph=False, reduce_retracing=True), before_trace)


class _LoopFunction:
    """The model's ``train_function`` while the graph loop runs: ``before_trace(element_spec)`` eagerly
    (the variables it creates exist before tf.function traces, so it traces once), then ``function``."""

    def __init__(self, function: Any, before_trace: Any) -> None:
        self.function, self._before_trace = function, before_trace

    def __call__(self, iterator: Any) -> Any:
        if self._before_trace is not None:
            self._before_trace(iterator.element_spec)
        return self.function(iterator)


class GraphLoop:
    """One ``fit`` call's graph loop on ``model`` (see the module docstring).

    Args:
        model: the adopted tf-keras model.
        strategy: its SkipCorrectStrategy.
        tk: tf-keras's modules (``_compat.tf_keras_internals()``).
        callbacks: the ``callbacks`` argument of the ``fit`` call.
    """

    def __init__(self, model: Any, strategy: Any, tk: Any, callbacks: Optional[Sequence[Any]]) -> None:
        self.model, self.strategy, self.tk = model, strategy, tk
        self._user_spe: Optional[int] = None
        self.active = self._applies(callbacks or [])
        # callbacks that need a call to end at a given step (e.g. an evaluation every N steps)
        self._stops = [cb for cb in callbacks or [] if callable(getattr(cb, "steps_to_next_stop", None))]

    def _applies(self, callbacks: Sequence[Any]) -> bool:
        m, tk = self.model, self.tk
        if not self.strategy.extended.graph_loop or m.run_eagerly:
            return False
        spe = m.steps_per_execution
        if spe is None or int(spe.numpy()) != 1 or m.autotune_steps_per_execution:
            return False  # the user chose: keep it
        if type(m).make_train_function is not tk.training.Model.make_train_function:
            return False
        for cb in callbacks:
            if isinstance(cb, tk.callbacks.BackupAndRestore) and cb.save_freq not in ("epoch", False):
                return False  # it counts calls: backups every N steps need one step per call
            if getattr(cb, "needs_every_step", False):
                return False  # it acts between two steps (e.g. SkipCorrectTelemetry's interval policy)
        return True

    # ---- around fit ----------------------------------------------------------------------------------
    def begin(self) -> None:
        """Build the step's variables, install the loop function, set the first call's length."""
        if not self.active:
            return
        m = self.model
        self._prebuild()
        if m.train_function is None or m.train_function is not m.__dict__.get(_LOOP):
            step = m.make_train_function(force=True)  # tf-keras's single-step function (spe is 1 here)
            loop = _loop_function(step, m.steps_per_execution, self._build_compiled, self._idle_hooks())
            m.train_function = loop
            object.__setattr__(m, _LOOP, loop)
        self._user_spe = 1
        self.update()

    def _idle_hooks(self) -> Any:
        """period="time": the loop skips the steps at which every local replica is idle."""
        ext = self.strategy.extended
        state = ext.correction_state(self.model.optimizer)
        if ext.time_period is None or state is None or _compat.num_workers(ext) <= 1:
            return None  # one worker: its fastest replica takes every step, nothing to skip
        return ext.time_period.idle_hooks(self.model.optimizer, state, ext._sc_warmup)

    def end(self) -> None:
        """Give the model its ``steps_per_execution`` back."""
        if self.active and self._user_spe is not None:
            self.model.steps_per_execution.assign(self._user_spe)
            self._user_spe = None

    def update(self) -> None:
        """Set ``steps_per_execution`` to the steps up to the next scheduled sync (eager reads)."""
        m, ext = self.model, self.strategy.extended
        opt = m.optimizer
        state = ext.correction_state(opt)
        k = int(state.local_steps.numpy()) if state is not None else 0
        t = int(opt.iterations.numpy())
        h = ext.interval_state.next_interval(int(ext.telemetry.steps.numpy()))
        n = steps_to_next_sync(t, k, h, ext._sc_warmup)
        for cb in self._stops:
            n = min(n, max(1, int(cb.steps_to_next_stop())))
        m.steps_per_execution.assign(n)

    def _prebuild(self) -> None:
        """Create the optimizer's slots and the correction state now, not in the first trace (a variable
        created while tracing makes tf.function trace the step a second time). Only for tf-keras's own
        ``train_step`` (``optimizer.minimize(loss, model.trainable_variables)``) with a current
        tf-keras optimizer; anything else builds them in the trace, as before."""
        m, tk = self.model, self.tk
        opt = m.optimizer
        if type(m).train_step is not tk.training.Model.train_step or type(opt).__module__.startswith(
            "tf_keras.src.mixed_precision"
        ):
            return
        if not isinstance(opt, tk.optimizer.Optimizer) or not m.built:
            return  # a model built by its first call (no input shape) builds them in the trace
        variables = list(m.trainable_variables)
        if not variables:
            return
        with self.strategy.scope():
            opt.build(variables)
            self.strategy.extended._sc_state(opt, variables)

    def _build_compiled(self, element_spec: Any) -> None:
        """Build the compiled loss and metrics (their variables) from the data's and the model's output
        specs before the step is traced, as tf-keras would in the trace. Only for a model with static
        ``outputs`` and (x, y[, sample_weight]) data; anything else builds them in the trace, as before."""
        m = self.model
        if getattr(m.compiled_metrics, "built", True) and getattr(m.compiled_loss, "built", True):
            return
        spec = _compat.first_replica_spec(element_spec)
        if not isinstance(spec, (tuple, list)) or len(spec) not in (2, 3) or not getattr(m, "outputs", None):
            return
        y_spec = spec[1]
        flat = tf.nest.flatten(y_spec) + list(m.outputs)
        if not all(
            isinstance(getattr(t, "dtype", None), tf.DType) and t.shape.rank is not None for t in flat
        ):
            return

        def zeros(t: Any) -> tf.Tensor:
            return tf.zeros([d if d is not None else 1 for d in t.shape.as_list()], t.dtype)

        y_true = tf.nest.map_structure(zeros, y_spec)
        outs = [zeros(t) for t in m.outputs]
        y_pred = outs[0] if len(outs) == 1 else outs
        with self.strategy.scope():
            m.compiled_loss.build(y_pred)
            m.compiled_metrics.build(y_pred, y_true)

    def callback(self) -> Any:
        """The callback that re-sets the call length after every call and at every epoch's start."""
        loop = self

        class _GraphLoop(self.tk.callbacks.Callback):
            _supports_tf_logs = True

            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                loop.update()

            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                loop.update()

        return _GraphLoop()
