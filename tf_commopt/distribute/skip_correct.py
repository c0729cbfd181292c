"""SkipCorrectStrategy: local updates on every replica, one fused global average every H steps,
and a divergence correction (thesis 001: "skip-and-correct").

Example:
    >>> import os; os.environ["TF_USE_LEGACY_KERAS"] = "1"          # doctest: +SKIP
    >>> import tensorflow as tf                                       # doctest: +SKIP
    >>> from tf_commopt.distribute import SkipCorrectStrategy          # doctest: +SKIP
    >>> strategy = SkipCorrectStrategy(interval=4, correction="vrl")   # doctest: +SKIP
    >>> with strategy.scope():                                        # doctest: +SKIP
    ...     model = tf.keras.Sequential([tf.keras.layers.Dense(10)])
    ...     model.compile("sgd", "sparse_categorical_crossentropy")
    >>> model.fit(x, y, epochs=1)                                     # doctest: +SKIP
    >>> strategy.stats()["syncs"]                                     # doctest: +SKIP

The exact rule (docs/skip_correct.md). Steps t = 1, 2, ... are counted per ``apply_gradients``
(``optimizer.iterations`` after the step); R = ``num_replicas_in_sync``; lr = the optimizer's current
learning rate; Δ_i = 0 initially. Gradients follow tf.distribute's convention (the loss of each replica
is scaled by 1/global batch, so the SUM over replicas is the global gradient); replica i's own
estimate of the gradient is therefore R·g_i.

* t ≤ warmup_steps: synchronous SGD — the gradients are all-reduced (SUM) and applied, as
  MirroredStrategy does.
* otherwise, local step: replica i applies R·g_i − Δ_i to its own copy x_i with the user's optimizer
  (no gradient all-reduce). k ← k + 1 (local steps since the last scheduled sync).
* when k == H (i.e. (t − warmup_steps) mod H == 0 for a fixed H): x̄ = mean_i x_i — one fused
  all-reduce of all trainable variables packed into one flat buffer per dtype, plus the non-trainable
  MEAN-aggregated state (BatchNorm moving statistics) and, if ``average_optimizer_state``, the
  optimizer slots; for ``vrl``: Δ_i ← Δ_i + (x̄ − x_i)/(k·lr); for ``gradient`` (the raw gradients
  R·g_i summed over the period, G_i, travel in the same all-reduce): Δ_i ← (G_i − Ḡ)/k, G_i ← 0; then
  x_i ← x̄ and k ← 0. The default ``correction="auto"`` is ``vrl`` for plain SGD (where the two are
  equal) and ``gradient`` for every other optimizer (tf_commopt/distribute/correction.py).

With ``correction="none"`` and H = 1 this is exactly synchronous SGD (for plain SGD; with stateful
optimizers the slots stay local unless ``average_optimizer_state=True``).

Design: a thin :class:`SkipCorrectStrategy` over TensorFlow's own MirroredStrategy machinery (one
process, several devices) or MultiWorkerMirroredStrategy machinery (a TF_CONFIG cluster, one replica
per worker); the behaviour lives in the StrategyExtended subclasses via :class:`_SkipCorrectMixin`.
tf-keras optimizers built under the scope route ``apply_gradients`` to the strategy (a per-instance
wrapper, a no-op for any other strategy); the ``evaluate/predict/save/save_weights`` of models built under
the scope average the replicas first (tf_commopt/distribute/_keras_hooks.py).
Reading a variable in cross-replica context returns the mean of the local replicas' copies (the global
model in one process); on a multi-worker cluster it is this worker's copy, and a one-time warning says
so (call ``strategy.sync()`` first).
"""

from __future__ import annotations

import logging
import os
import sys
import time
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import tensorflow as tf

from tf_commopt._compat import collective_all_reduce_strategy as _cars
from tf_commopt._compat import (
    collective_util,
    distribute_lib,
    next_collective_key_base,
    optimizer_lr,
    optimizer_momentum,
    optimizer_slots,
    tfconfig_cluster_resolver,
)
from tf_commopt._compat import mirrored_strategy as _ms
from tf_commopt._compat import values as _values
from tf_commopt.core.interval import validate_interval, validate_max_interval, validate_target_ratio
from tf_commopt.distribute import _keras_hooks
from tf_commopt.distribute import correction as _corr
from tf_commopt.distribute.interval_state import IntervalState
from tf_commopt.distribute.overlap import OverlapAverager, validate_overlap
from tf_commopt.distribute.state import SkipCorrectState, _pass_through
from tf_commopt.distribute.telemetry import Telemetry
from tf_commopt.errors import InputError

__all__ = ["SkipCorrectStrategy", "SkipCorrectExtended", "MultiWorkerSkipCorrectExtended"]

_log = logging.getLogger("tf_commopt.distribute")
_WARNED: Dict[str, bool] = {}


# Our step code builds its graph with explicit tf.cond; autograph converting it (it is reached from the
# converted train_step) cost ~3 s of the first step's tracing and changes nothing.
_no_autograph = tf.autograph.experimental.do_not_convert


def _warn_once(key: str, message: str) -> None:
    if not _WARNED.get(key):
        _WARNED[key] = True
        _log.warning(message)


class _SkipCorrectMirroredVariable(_values.MirroredVariable):
    """A MirroredVariable whose cross-replica read is the mean of the local replicas' copies.

    Between two syncs the replicas hold different values; reading one arbitrary copy would silently
    return a local model. Saving uses the same read, so checkpoints hold the (local) mean.
    """

    def _get_cross_replica(self):
        comps = self._values
        if not self.dtype.is_floating or len(comps) == 1:
            ext = self._distribute_strategy.extended
            if self.dtype.is_floating and getattr(ext, "_num_workers", 1) > 1:
                _warn_once(
                    "mw_read",
                    "SkipCorrectStrategy: a variable read in cross-replica context on a "
                    "multi-worker cluster is this worker's copy; it is the global model only right "
                    "after a sync (call strategy.sync() first)",
                )
            return tf.identity(comps[0].read_value())
        with tf.device(comps[0].device):
            return tf.add_n([c.read_value() for c in comps]) / tf.cast(len(comps), self.dtype)


def _components(value: Any) -> List[Any]:
    if isinstance(value, _values.DistributedValues):
        return list(value.values)
    return [value]


class _SkipCorrectMixin:
    """Skip-and-correct behaviour shared by the single-process and multi-worker extendeds."""

    def _sc_init(
        self,
        interval: Union[int, str],
        correction: str,
        warmup_steps: int,
        average_optimizer_state: bool,
        correction_lr: str = "effective",
        target_ratio: float = 1.0,
        max_interval: int = 256,
        auto_warmup_steps: int = 2,
        auto_probe_interval: int = 16,
        auto_measure_syncs: int = 3,
        overlap: bool = False,
    ) -> None:
        self._sc_overlap = bool(overlap)
        self._sc_overlappers: Dict[int, OverlapAverager] = {}
        self._sc_correction_lr = correction_lr
        self._sc_correction = correction
        self._sc_warmup = int(warmup_steps)
        self._sc_avg_slots = bool(average_optimizer_state)
        self.interval_state = IntervalState(
            interval,
            target_ratio=target_ratio,
            max_interval=max_interval,
            warmup_steps=auto_warmup_steps,
            probe_interval=auto_probe_interval,
            measure_syncs=auto_measure_syncs,
            overlap=self._sc_overlap,
        )
        self.telemetry = Telemetry(overlap=self._sc_overlap)
        self._sc_train_graphs: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._sc_states: Dict[int, SkipCorrectState] = {}
        self._sc_vars: List[weakref.ref] = []
        self._sc_internal = False

    # ---- variables -------------------------------------------------------------------------------
    def _create_variable(self, next_creator, **kwargs):
        if self._sc_internal and isinstance(self, _cars.CollectiveAllReduceExtended):
            # our own state (the Δ_i, zeros on every worker): the one-device-per-worker mirrored creator,
            # without MultiWorkerMirrored's broadcast of the initial value (a round trip per variable
            # at start-up)
            return _ms.MirroredExtended._create_variable(self, next_creator, **kwargs)
        if not self._sc_internal:
            _keras_hooks.refuse_keras3()  # a Keras 3 layer/optimizer would train without skipping
            _keras_hooks.adopt_callers()  # the tf-keras optimizer / model creating it reaches this strategy
        v = super()._create_variable(next_creator, **kwargs)
        if type(v) is _values.MirroredVariable and not self._sc_internal:
            v.__class__ = _SkipCorrectMirroredVariable
        if not self._sc_internal and isinstance(v, _values.DistributedVariable):
            self._sc_vars.append(weakref.ref(v))
        return v

    @_no_autograph
    def _sc_live_vars(self) -> List[Any]:
        out = []
        for r in self._sc_vars:
            v = r()
            if v is not None:
                out.append(v)
        return out

    @_no_autograph
    def _sc_extra_vars(self, exclude: Sequence[Any], optimizer: Any = None) -> List[Any]:
        """Non-trainable float state averaged at each sync: MEAN-aggregated ON_READ variables
        (BatchNorm moving statistics) and, if asked, the optimizer's slot variables."""
        seen = {id(v) for v in exclude}
        out = []
        for v in self._sc_live_vars():
            if id(v) in seen or not v.dtype.is_floating or v.trainable:
                continue
            if isinstance(v, _values.SyncOnReadVariable) and v.aggregation == tf.VariableAggregation.MEAN:
                out.append(v)
                seen.add(id(v))
        if self._sc_avg_slots and optimizer is not None:
            for v in optimizer_slots(optimizer):
                if id(v) not in seen:
                    out.append(v)
                    seen.add(id(v))
        return out

    # ---- state ------------------------------------------------------------------------------------
    @_no_autograph
    def _sc_state(self, optimizer: Any, var_list: Sequence[Any]) -> SkipCorrectState:
        key = id(optimizer)
        state = self._sc_states.get(key)
        if state is None:
            with tf.init_scope():
                beta = float(optimizer_momentum(optimizer))
                rule = _corr.resolve_correction(
                    self._sc_correction,
                    type(optimizer).__name__,
                    beta,
                    bool(getattr(optimizer, "nesterov", False)),
                )
                self._sc_internal = True
                try:
                    state = SkipCorrectState(self._container_strategy(), list(var_list), rule, optimizer)
                finally:
                    self._sc_internal = False
                self._sc_states[key] = state
                optimizer._track_trackable(state, name="skip_correct_state", overwrite=True)
            if state.rule == "vrl" and self._sc_correction_lr == "optimizer" and beta > 0:
                _warn_once(
                    "momentum",
                    f"SkipCorrectStrategy: vrl with heavy-ball momentum {beta:g} and "
                    "correction_lr='optimizer' (the rule as stated) over-corrects by up to 1/(1-momentum) "
                    "and can diverge; consider correction_lr='effective' (docs/skip_correct.md)",
                )
        else:
            known = {id(v) for v in state.variables}
            if any(id(v) not in known for v in var_list):
                raise _pass_through(
                    InputError(
                        "apply_gradients got a variable that was not in its first call; "
                        "SkipCorrectStrategy keeps one correction per variable of the "
                        "first list",
                        where="SkipCorrectStrategy",
                    )
                )
        return state

    def correction_state(self, optimizer: Any) -> Optional[SkipCorrectState]:
        """The per-replica correction state (Δ_i, local-step counter) of ``optimizer``, or None."""
        return self._sc_states.get(id(optimizer))

    # ---- the step ---------------------------------------------------------------------------------
    @_no_autograph
    def _sc_apply(
        self, optimizer: Any, original: Any, grads_and_vars: Any, name: Optional[str], legacy: bool
    ) -> Any:
        """Replica-context ``apply_gradients``: local step with correction, then maybe a sync."""
        ctx = tf.distribute.get_replica_context()
        if not tf.executing_eagerly():
            self._sc_train_graphs.add(tf.compat.v1.get_default_graph())
        pairs = [(g, v) for g, v in grads_and_vars]
        live = [(g, v) for g, v in pairs if g is not None]
        if not live:
            return original(optimizer, pairs, name=name, **_no_agg(legacy))
        grads = [g for g, _ in live]
        var_list = [v for _, v in live]
        new_grads = ctx.merge_call(self._sc_prepare_grads, args=(optimizer, var_list, grads))
        result = original(optimizer, list(zip(new_grads, var_list)), name=name, **_no_agg(legacy))
        ctx.merge_call(self._sc_after_step, args=(optimizer, var_list))
        return result

    @_no_autograph
    def _sc_prepare_grads(self, strategy: Any, optimizer: Any, var_list: Sequence[Any], grads: Sequence[Any]):
        """Cross-replica: R·g_i − Δ_i per replica (local phase) or the SUM all-reduce (warm-up)."""
        state = self._sc_state(optimizer, var_list)
        r = float(self._num_replicas_in_sync)
        per_var = [_components(g) for g in grads]
        n_local = len(per_var[0])
        index = {id(v): j for j, v in enumerate(state.variables)}
        deltas = state.delta_components()
        if deltas is not None:
            deltas = [deltas[index[id(v)]] for v in var_list]
        sums = state.grad_sum_components()
        if sums is not None:
            sums = [sums[index[id(v)]] for v in var_list]

        def local() -> List[Any]:
            out = []
            for j, comps in enumerate(per_var):
                row = []
                for i, g in enumerate(comps):
                    with tf.device(_device_of(comps[i], self.worker_devices[i])):
                        g = tf.convert_to_tensor(g) * tf.cast(r, g.dtype)
                        if sums is not None:  # "gradient": G_i += R·g_i (the raw estimate)
                            acc = sums[j][i].assign_add(tf.cast(g, sums[j][i].dtype))
                            with tf.control_dependencies([acc]):
                                g = tf.identity(g)
                        if deltas is not None:
                            g = g - tf.cast(deltas[j][i].read_value(), g.dtype)
                    row.append(g)
                out.append(row)
            return out

        if self._sc_warmup > 0:
            t_next = tf.cast(optimizer.iterations, tf.int64) + 1
            warm = t_next <= self._sc_warmup

            def ssgd() -> List[Any]:
                dense = [[tf.convert_to_tensor(g) for g in comps] for comps in per_var]
                reduced = self._sc_fused_reduce(tf.distribute.ReduceOp.SUM, dense)
                return reduced

            flat_local = lambda: _flatten(local())  # noqa: E731
            flat_ssgd = lambda: _flatten(ssgd())  # noqa: E731
            out = _unflatten(tf.cond(warm, flat_ssgd, flat_local), len(per_var), n_local)
        else:
            out = local()
        return [self._sc_regroup(row) for row in out]

    @_no_autograph
    def _sc_after_step(self, strategy: Any, optimizer: Any, var_list: Sequence[Any]) -> None:
        """Cross-replica: count the step; at k == H average (and correct)."""
        state = self._sc_states[id(optimizer)]
        t = tf.cast(optimizer.iterations, tf.int64)  # read after the optimizer's increment
        with tf.control_dependencies([t]):  # the clock starts once this step's local update is done
            self._sc_step_bookkeeping(optimizer, var_list, state, t)

    @_no_autograph
    def _sc_step_bookkeeping(
        self, optimizer: Any, var_list: Sequence[Any], state: SkipCorrectState, t: tf.Tensor
    ) -> None:
        tel, ivs = self.telemetry, self.interval_state
        step_dt = tel.step_time()
        steps = tel.steps.assign_add(1)
        local_phase = t > self._sc_warmup
        k = state.local_steps.read_value() + tf.cast(local_phase, tf.int64)
        h = ivs.effective(steps)
        do_sync = tf.logical_and(local_phase, k >= h)
        var_list = state.variables  # every variable of the state, also those without a gradient this step
        extras = self._sc_extra_vars(var_list, optimizer)

        def sync() -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
            lr = None
            if (
                state.rule == "vrl"
            ):  # only vrl's update needs the lr: read it in the sync branch, not every step
                lr = optimizer_lr(optimizer)
                if self._sc_correction_lr == "effective":
                    lr = lr / (1.0 - optimizer_momentum(optimizer))
            if self._sc_overlap:  # apply the in-flight mean, snapshot and launch the next one (overlap.py)
                scale = tf.cast(k, tf.float64) * (tf.cast(lr, tf.float64) if lr is not None else 1.0)
                dt, bg = self._sc_overlapper(state, list(var_list) + extras, len(var_list)).sync(scale)
                self.telemetry.add_sync(dt, background=bg)
                return tf.constant(0, tf.int64), dt, bg
            dt = self._sc_average(
                list(var_list) + extras, state=state, n_trainable=len(var_list), local_steps=k, lr=lr
            )
            return tf.constant(0, tf.int64), dt, dt

        def skip() -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
            return k, tf.constant(0.0, tf.float64), tf.constant(0.0, tf.float64)

        new_k, sync_dt, comm_sample = tf.cond(do_sync, sync, skip)
        state.local_steps.assign(new_k)
        deps = [new_k]
        if ivs.auto:
            # a t_comm sample: the sync's all-reduce (with overlap: the background one applied at this sync)
            sampled = tf.logical_and(do_sync, comm_sample > 0) if self._sc_overlap else do_sync
            with tf.control_dependencies([new_k]):
                deps.append(
                    ivs.record(steps, step_dt, sampled, comm_sample, tel.comm_s.read_value(), self._sc_agree)
                )
        with tf.control_dependencies(deps):
            tel.last_end.assign(tf.timestamp())

    @_no_autograph
    def _sc_overlapper(
        self, state: SkipCorrectState, variables: List[Any], n_trainable: int
    ) -> OverlapAverager:
        """The overlapped averaging of ``state`` (built at the first trace of its sync)."""
        avg = self._sc_overlappers.get(id(state))
        if avg is None:
            avg = OverlapAverager(
                self,
                self._container_strategy(),
                variables,
                n_trainable,
                state.rule,
                state.delta_components(),
                state.grad_sum_components(),
            )
            self._sc_overlappers[id(state)] = avg
        elif not avg.same_layout(variables):
            raise _pass_through(
                InputError(
                    "the averaged variables changed between two traces of the training "
                    "step (e.g. optimizer slots created later); overlap=True needs a "
                    "fixed set",
                    where="SkipCorrectStrategy(overlap=True)",
                )
            )
        return avg

    def drain(self) -> int:
        """Apply every in-flight overlapped averaging now (eager; no new communication: it waits for the
        background all-reduce, and the wait counts in ``comm_s``). Returns how many were applied."""
        if not self._sc_overlappers:
            return 0
        t0 = time.perf_counter()
        applied = [bg for bg in (a.drain() for a in list(self._sc_overlappers.values())) if bg is not None]
        if applied:
            dt = time.perf_counter() - t0
            self.telemetry.comm_s.assign_add(dt)
            self.telemetry.drain_s.assign_add(dt)
            self.telemetry.background_comm_s.assign_add(sum(applied))
        return len(applied)

    @_no_autograph
    def _sc_agree(self, vec: tf.Tensor) -> tf.Tensor:
        """MEAN of a small float vector over all replicas (every worker calls it at the same step)."""
        comps = []
        for d in self.worker_devices:
            with tf.device(d):
                comps.append(tf.identity(vec))
        value = self._sc_regroup(comps)
        return _components(self.reduce_to(tf.distribute.ReduceOp.MEAN, value, destinations=value))[0]

    # ---- communication (the one place) ------------------------------------------------------------
    @_no_autograph
    def _sc_fused_reduce(self, op: Any, per_var: List[List[tf.Tensor]]) -> List[List[tf.Tensor]]:
        """All-reduce many tensors as one flat buffer per dtype. per_var[j][i] = var j on replica i."""
        n_local = len(per_var[0]) if per_var else 0
        out: List[List[Optional[tf.Tensor]]] = [[None] * n_local for _ in per_var]
        by_dtype: Dict[tf.DType, List[int]] = {}
        for j, comps in enumerate(per_var):
            by_dtype.setdefault(comps[0].dtype, []).append(j)
        payload = 0
        for dtype, idx in by_dtype.items():
            sizes = [int(per_var[j][0].shape.num_elements()) for j in idx]
            payload += sum(sizes) * dtype.size
            bufs = []
            for i in range(n_local):
                with tf.device(per_var[idx[0]][i].device or self.worker_devices[i]):
                    bufs.append(tf.concat([tf.reshape(per_var[j][i], [-1]) for j in idx], axis=0))
            value = self._sc_regroup(bufs)
            reduced = _components(self.reduce_to(op, value, destinations=value))
            for i in range(n_local):
                with tf.device(bufs[i].device):
                    pieces = tf.split(reduced[i], sizes) if len(sizes) > 1 else [reduced[i]]
                    for j, piece in zip(idx, pieces):
                        out[j][i] = tf.reshape(piece, tf.shape(per_var[j][i]))
        self.telemetry.bytes.assign_add(payload)
        return out  # type: ignore[return-value]

    @_no_autograph
    def _sc_average(
        self,
        variables: Sequence[Any],
        state: Optional[SkipCorrectState] = None,
        n_trainable: int = 0,
        local_steps: Any = None,
        lr: Any = None,
    ) -> tf.Tensor:
        """x̄ = mean_i x_i in one fused all-reduce; optional Δ update for the first n_trainable; x_i ← x̄.
        Returns the seconds it took (float64)."""
        if not variables:
            return tf.constant(0.0, tf.float64)
        t0 = tf.timestamp()
        rule = state.rule if state is not None else "none"
        sums = state.grad_sum_components() if rule == "gradient" else None
        with tf.control_dependencies([t0]):
            comps = [[c.read_value() for c in v.values] for v in variables]
            if sums is not None:  # G_i travel in the same fused all-reduce as the model
                comps += [[c.read_value() for c in row] for row in sums]
        means = self._sc_fused_reduce(tf.distribute.ReduceOp.MEAN, comps)
        deltas = state.delta_components() if state is not None else None
        ops = []
        for j, v in enumerate(variables):
            for i, c in enumerate(v.values):
                with tf.device(c.device):
                    if deltas is not None and j < n_trainable:
                        d = deltas[j][i]
                        if rule == "vrl":
                            scale = tf.cast(local_steps, d.dtype) * tf.cast(lr, d.dtype)
                            new_d = _corr.vrl_delta_update(
                                d.read_value(),
                                tf.cast(means[j][i], d.dtype),
                                tf.cast(comps[j][i], d.dtype),
                                1.0,
                                scale,
                            )
                        else:  # "gradient": Δ_i = (G_i − Ḡ)/k, then G_i ← 0
                            g_i, g_bar = comps[len(variables) + j][i], means[len(variables) + j][i]
                            new_d = _corr.gradient_delta(g_i, g_bar, tf.cast(local_steps, d.dtype))
                            ops.append(sums[j][i].assign(tf.zeros_like(g_i)))
                        ops.append(d.assign(tf.cast(new_d, d.dtype)))
                    ops.append(c.assign(means[j][i]))
        with tf.control_dependencies(ops):
            t1 = tf.timestamp()
        self.telemetry.add_sync(t1 - t0)
        return t1 - t0

    # ---- metrics: per worker between syncs --------------------------------------------------------
    @_no_autograph
    def _sc_in_train_graph(self) -> bool:
        g = tf.compat.v1.get_default_graph()
        while g is not None:
            if g in self._sc_train_graphs:
                return True
            g = getattr(g, "outer_graph", None)
        return False

    @_no_autograph
    def _reduce(self, reduce_op: Any, value: Any) -> Any:
        """``strategy.reduce(op, v, axis=None)``; the path of every cross-replica read of a SyncOnRead
        variable (tf-keras metric totals and counts read by ``Metric.result()``).

        On a multi-worker cluster, inside a traced step that runs skip-and-correct updates, a metric read
        is reduced over this worker's replicas only: no collective, sync step or not. Everywhere else
        (``evaluate``, eager reads) it is the usual reduction over all workers — and tf-keras re-reads
        every metric eagerly at an epoch's end, so the epoch's values (History, the progress bar's final
        line, callbacks' ``on_epoch_end`` logs) are global, as under MultiWorkerMirroredStrategy; the
        per-batch values in between are this worker's running means.
        """
        if (
            getattr(self, "_num_workers", 1) > 1
            and isinstance(value, _values.SyncOnReadVariable)
            and not tf.executing_eagerly()
            and self._sc_in_train_graph()
        ):
            comps = list(value.values)
            with tf.device(comps[0].device):
                total = tf.add_n([c.read_value() for c in comps]) if len(comps) > 1 else comps[0].read_value()
                if reduce_op == tf.distribute.ReduceOp.MEAN and len(comps) > 1:
                    total = total / tf.cast(len(comps), total.dtype)
                return tf.identity(total)
        return super()._reduce(reduce_op, value)

    def _sc_regroup(self, comps: List[Any]) -> Any:
        return _values.PerReplica(tuple(comps))

    # ---- out-of-rhythm sync -----------------------------------------------------------------------
    def sync_now(self) -> None:
        """Average every replica's model now (no Δ update, the H rhythm is kept). With overlap, the
        in-flight averaging is applied first (its Δ update included)."""
        self.drain()
        states = list(self._sc_states.values())
        if states:
            trainable: List[Any] = []
            seen = set()
            for s in states:
                for v in s.variables:
                    if id(v) not in seen:
                        trainable.append(v)
                        seen.add(id(v))
        else:
            trainable = [v for v in self._sc_live_vars() if v.trainable and v.dtype.is_floating]
        extras = self._sc_extra_vars(trainable)
        if self._sc_avg_slots:
            for opt_state in states:
                opt = opt_state.optimizer
                if opt is not None:
                    for v in optimizer_slots(opt):
                        if all(v is not e for e in extras):
                            extras.append(v)
        self._sc_average(trainable + extras)
        self.telemetry.reset_clock()


def _no_agg(legacy: bool) -> Dict[str, bool]:
    return {"experimental_aggregate_gradients": False} if legacy else {"skip_gradients_aggregation": True}


def _device_of(t: Any, default: str) -> str:
    return getattr(t, "device", None) or default


def _flatten(rows: List[List[Any]]) -> List[Any]:
    return [x for row in rows for x in row]


def _unflatten(flat: Sequence[Any], n_vars: int, n_local: int) -> List[List[Any]]:
    flat = list(flat)
    return [flat[j * n_local : (j + 1) * n_local] for j in range(n_vars)]


class SkipCorrectExtended(_SkipCorrectMixin, _ms.MirroredExtended):
    """MirroredStrategy machinery (one process, several devices) with skip-and-correct updates."""

    def __init__(self, container_strategy, devices=None, **sc):
        _ms.MirroredExtended.__init__(self, container_strategy, devices=devices)
        self._sc_init(**sc)


class MultiWorkerSkipCorrectExtended(_SkipCorrectMixin, _cars.CollectiveAllReduceExtended):
    """MultiWorkerMirroredStrategy machinery (a TF_CONFIG cluster) with skip-and-correct updates."""

    def __init__(self, container_strategy, cluster_resolver=None, **sc):
        _cars.CollectiveAllReduceExtended.__init__(
            self,
            container_strategy,
            cluster_resolver=cluster_resolver,
            communication_options=collective_util.Options(),
        )
        self._sc_init(**sc)


def _tf_config_has_cluster() -> bool:
    from tf_commopt.core.tfconfig import tf_config_from_env

    if tf_config_from_env() is None:  # unset or blank; a malformed TF_CONFIG is a one-line InputError here
        return False
    return bool(tfconfig_cluster_resolver.TFConfigClusterResolver().cluster_spec().as_dict())


def _check_keras() -> None:
    """Keras 3 optimizers do not route through tf.distribute's update path we extend: point to tf-keras."""
    if "tf_keras" in sys.modules or os.environ.get("TF_USE_LEGACY_KERAS", "") in ("1", "true", "True"):
        return
    try:
        import keras  # noqa: F401

        major = int(str(getattr(keras, "__version__", "0")).split(".")[0])
    except Exception:  # no Keras at all: custom loops with tf-keras optimizers only
        return
    if major >= 3:
        raise InputError(
            "Keras 3 is the active tf.keras, and its optimizers all-reduce gradients themselves; "
            "SkipCorrectStrategy needs tf-keras: pip install tf-keras and set "
            "TF_USE_LEGACY_KERAS=1 before importing tensorflow",
            where="SkipCorrectStrategy",
        )


class SkipCorrectStrategy(distribute_lib.Strategy):
    """Local SGD with periodic global averaging and divergence correction, as a tf.distribute strategy.

    Example:
        >>> strategy = SkipCorrectStrategy(interval=4, correction="vrl")   # doctest: +SKIP
        >>> with strategy.scope():                                         # doctest: +SKIP
        ...     model = make_model(); model.compile("sgd", "mse")
        >>> model.fit(x, y)                                                # doctest: +SKIP

    Args:
        interval: H, local steps between two global averagings (int ≥ 1), or ``"auto"`` (thesis 001's
            rule from the first iterations' timings, measured robustly: H = 1 for ``auto_warmup_steps``
            steps (tracing, collective set-up), then H = ``auto_probe_interval`` until
            ``auto_measure_syncs`` syncs are timed; every step is a t_comp sample, every sync a t_comm
            sample; the workers average their medians (one all-reduce of two floats) and every worker
            sets H = clip(round(t̃_comm / (target_ratio·t̃_comp)), 1, max_interval) and keeps it. Works in
            model.fit and custom loops (it lives in the step counting); see ``stats()`` and
            :mod:`tf_commopt.distribute.interval_state`.
        correction: ``"auto"`` (default: ``"vrl"`` for plain SGD, ``"gradient"`` for any other
            optimizer), ``"gradient"`` (the control variate from the period's averaged raw gradients,
            applied before the optimizer: momentum, Nesterov, Adam, RMSprop, ...; the gradient sums
            double a sync's bytes), ``"vrl"`` (VRL-SGD, Liang et al. 2019: the model-space form, exact
            for plain SGD) or ``"none"`` (plain local SGD).
        warmup_steps: steps of plain synchronous SGD before local steps begin (post-local SGD).
        average_optimizer_state: also average the optimizer slots (momentum, Adam moments) at each
            sync; by default they stay local.
        devices: local devices, as for MirroredStrategy (ignored with a TF_CONFIG cluster).
        cluster_resolver: a ClusterResolver for multi-worker training (default: TF_CONFIG).
        correction_lr: the lr in the vrl update: ``"effective"`` (default: lr / (1 − β) for tf-keras SGD
            with heavy-ball momentum β — the steady-state step per unit gradient; exactly the
            optimizer's lr for plain SGD and other optimizers) or ``"optimizer"`` (the rule read
            literally: the optimizer's current learning rate, which over-corrects with momentum).
        target_ratio: ``"auto"`` only: the aimed (communication time)/(computation time) per epoch.
        max_interval: ``"auto"`` only: cap on the chosen H.
        auto_warmup_steps: ``"auto"`` only: steps (≥ 1) at H = 1 before measuring.
        auto_probe_interval: ``"auto"`` only: H while measuring (≥ 1).
        auto_measure_syncs: ``"auto"`` only: timed syncs (≥ 1) before H is chosen.
        overlap: run each sync's all-reduce in the background while the replicas keep stepping, and apply
            the (one interval stale) average at the next sync as x_i ← x_i + (ȳ − y_i) (y_i: replica i's
            snapshot; Overlap-Local-SGD, :mod:`tf_commopt.distribute.overlap`). With ``interval="auto"``
            H is chosen so that communication is hidden: H = clip(ceil(t̃_comm / (target_ratio·t̃_comp)),
            1, max_interval). ``sync()``, Keras evaluate/save and the end of ``fit`` apply an in-flight
            average first.
    """

    _collective_key_base = 0

    def __init__(
        self,
        interval: Union[int, str] = 4,
        correction: str = "auto",
        warmup_steps: int = 0,
        average_optimizer_state: bool = False,
        devices: Optional[Sequence[str]] = None,
        cluster_resolver: Any = None,
        correction_lr: str = "effective",
        target_ratio: float = 1.0,
        max_interval: int = 256,
        auto_warmup_steps: int = 2,
        auto_probe_interval: int = 16,
        auto_measure_syncs: int = 3,
        overlap: bool = False,
    ):
        interval = validate_interval(interval, where="SkipCorrectStrategy(interval=...)")
        correction = _corr.validate_correction(correction, where="SkipCorrectStrategy(correction=...)")
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise InputError(
                f"must be a non-negative integer, got {warmup_steps!r}",
                where="SkipCorrectStrategy(warmup_steps=...)",
            )
        correction_lr = _corr.validate_correction_lr(
            correction_lr, where="SkipCorrectStrategy(correction_lr=...)"
        )
        target_ratio = validate_target_ratio(target_ratio, where="SkipCorrectStrategy(target_ratio=...)")
        max_interval = validate_max_interval(max_interval, where="SkipCorrectStrategy(max_interval=...)")
        for name, v in (
            ("auto_warmup_steps", auto_warmup_steps),
            ("auto_probe_interval", auto_probe_interval),
            ("auto_measure_syncs", auto_measure_syncs),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(
                    f"must be an integer >= 1, got {v!r}", where=f"SkipCorrectStrategy({name}=...)"
                )
        overlap = validate_overlap(overlap, where="SkipCorrectStrategy(overlap=...)")
        _check_keras()
        sc = dict(
            overlap=overlap,
            interval=interval,
            correction=correction,
            warmup_steps=warmup_steps,
            average_optimizer_state=average_optimizer_state,
            correction_lr=correction_lr,
            target_ratio=float(target_ratio),
            max_interval=max_interval,
            auto_warmup_steps=auto_warmup_steps,
            auto_probe_interval=auto_probe_interval,
            auto_measure_syncs=auto_measure_syncs,
        )
        # distinct collective group keys per instance (as TensorFlow's tests do), the same sequence on
        # every worker when they build their strategies in the same order
        self._collective_key_base = next_collective_key_base()
        if cluster_resolver is not None or (devices is None and _tf_config_has_cluster()):
            if devices is not None:
                raise InputError("give devices or cluster_resolver, not both", where="SkipCorrectStrategy")
            extended = MultiWorkerSkipCorrectExtended(self, cluster_resolver=cluster_resolver, **sc)
        else:
            extended = SkipCorrectExtended(self, devices=devices, **sc)
        super().__init__(extended)
        _keras_hooks.install(SkipCorrectStrategy)

    @property
    def cluster_resolver(self) -> Any:
        return getattr(self.extended, "_cluster_resolver", None)

    @property
    def interval(self) -> int:
        """The current H."""
        return int(self.extended.interval_state.interval.numpy())

    @property
    def overlap(self) -> bool:
        """True when syncs are overlapped with local steps (``overlap=True``)."""
        return self.extended._sc_overlap

    @property
    def correction(self) -> str:
        return self.extended._sc_correction

    @property
    def warmup_steps(self) -> int:
        return self.extended._sc_warmup

    @property
    def auto_interval(self) -> bool:
        """True when constructed with ``interval="auto"`` (H is chosen after the first measured step)."""
        return self.extended.interval_state.auto

    def set_interval(self, interval: int) -> None:
        """Change H (every worker must set the same value). The hook point for interval policies."""
        interval = validate_interval(interval, where="SkipCorrectStrategy.set_interval")
        if interval == "auto":
            raise InputError("set_interval needs an integer", where="SkipCorrectStrategy.set_interval")
        self.extended.interval_state.set(int(interval))

    def sync(self) -> None:
        """Average the replicas now (cross-replica context; outside the H rhythm, no Δ update). With
        ``overlap=True`` an in-flight averaging is applied first (with its Δ update): call it before a
        custom-loop checkpoint so the file holds the global model and nothing is left in flight."""
        with self.scope():
            self.extended.sync_now()

    def stats(self) -> Dict[str, Any]:
        """Telemetry: interval, steps, syncs, comm_s, compute_s, bytes_communicated (this process).

        With ``interval="auto"`` also: ``interval_chosen`` (0/1), ``interval_t_comm_s`` and
        ``interval_t_comp_s`` (the timings averaged over workers, from which H was chosen),
        ``interval_overhead_s`` (extra seconds spent choosing H: the agreement all-reduce and the
        policy) and ``interval_selection_comm_s`` (all sync seconds before H was fixed: the H = 1 syncs
        including the measured ones, and any earlier out-of-rhythm sync — an upper bound on the syncs
        the selection added), ``interval_t_comm_samples_s`` / ``interval_t_comp_samples_s`` (this
        worker's probe samples: the spread behind the medians).
        """
        e = self.extended
        out: Dict[str, Any] = e.interval_state.as_dict()
        out.update(e.telemetry.as_dict())
        return out

    def reset_step_clock(self) -> None:
        """Forget the end time of the last step (so a pause, e.g. evaluation, is not counted as compute)."""
        self.extended.telemetry.reset_clock()
