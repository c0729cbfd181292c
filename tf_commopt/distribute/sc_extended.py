"""The behaviour of SkipCorrectStrategy, in its StrategyExtended (TensorFlow's split: a thin Strategy,
behaviour in StrategyExtended): the variables it creates and tracks, the per-optimizer correction state,
one training step (the local step of ``local_step.py``, then the step's bookkeeping: count it, ask the
interval policy, maybe sync with ``averaging.py`` or ``overlap.py``), metric reads and out-of-rhythm syncs.

tf-keras reaches it through ``_keras_hooks.py`` (``_sc_apply``, or ``_sc_prepare_grads`` +
``_sc_after_step`` for a legacy optimizer's first step). Two concrete classes: MirroredStrategy machinery
(one process, several devices) and MultiWorkerMirroredStrategy machinery (a TF_CONFIG cluster).

Example:
    >>> ext = SkipCorrectStrategy(interval=4).extended              # doctest: +SKIP
    >>> ext.correction_state(model.optimizer).delta_numpy()[0].shape  # doctest: +SKIP
    (4, 3, 2)
"""

from __future__ import annotations

import functools
import time
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import tensorflow as tf

from tf_commopt._compat import collective_all_reduce_strategy as _cars
from tf_commopt._compat import (
    collective_util,
    container_strategy,
    optimizer_lr,
    optimizer_momentum,
    optimizer_slots,
    track_child,
)
from tf_commopt._compat import mirrored_strategy as _ms
from tf_commopt._compat import values as _values
from tf_commopt.core.period import TimeBudget
from tf_commopt.distribute import _keras_hooks, averaging, compressed_sync, two_level, two_level_sync
from tf_commopt.distribute import correction as _corr
from tf_commopt.distribute.interval_policy import AutoInterval
from tf_commopt.distribute.local_step import local_gradients, no_aggregation
from tf_commopt.distribute.mean_read import BetweenSyncReads, MeanReadMirroredVariable, warn_once
from tf_commopt.distribute.overlap import OverlapAverager
from tf_commopt.distribute.state import SkipCorrectState, _pass_through
from tf_commopt.distribute.telemetry import Telemetry
from tf_commopt.distribute.two_level_interval import HostInterval, TwoLevelIntervalState, make_interval_state
from tf_commopt.distribute.unequal_sync import TimePeriodState
from tf_commopt.errors import InputError

__all__ = ["SkipCorrectExtended", "MultiWorkerSkipCorrectExtended"]

_no_autograph = tf.autograph.experimental.do_not_convert


class _SkipCorrectMixin(BetweenSyncReads):
    """Skip-and-correct behaviour shared by the single-process and multi-worker extendeds."""

    def _sc_init(
        self,
        interval: Union[int, AutoInterval],
        correction: str,
        warmup_steps: int,
        average_optimizer_state: bool,
        correction_lr: str = "effective",
        overlap: bool = False,
        graph_loop: bool = True,
        compression: Optional[str] = None,
        period: Optional[TimeBudget] = None,
        host_interval: HostInterval = None,
        hosts: Optional[Sequence[Any]] = None,
    ) -> None:
        self.host_interval = host_interval  # two-level: h, or its TwoLevelInterval (None: one level)
        self._sc_hosts = hosts
        self.two_level: Optional[two_level.TwoLevelAverager] = None  # built by _sc_build_period
        self.compression = compression  # None, "bf16" or "fp16": the scheduled syncs' wire dtype
        self.sync_payload_bytes = 0  # one replica's bytes in a scheduled sync (set when it is traced)
        self._sc_period = period  # None: every replica takes H steps; a TimeBudget: period="time"
        self.time_period: Optional[TimePeriodState] = None  # built by _sc_build_period
        self._sc_overlap = bool(overlap)
        self.graph_loop = bool(graph_loop)
        self._sc_overlappers: Dict[int, OverlapAverager] = {}
        self._sc_correction_lr = correction_lr
        self._sc_correction = correction
        self._sc_warmup = int(warmup_steps)
        self._sc_avg_slots = bool(average_optimizer_state)
        self.interval_state = make_interval_state(interval, host_interval, overlap=self._sc_overlap)
        self.telemetry = Telemetry(overlap=self._sc_overlap, two_level=host_interval is not None)
        self._sc_train_graphs: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._sc_states: Dict[int, SkipCorrectState] = {}
        self._sc_vars: List[weakref.ref] = []
        self._sc_internal = False
        self._sc_internal_init = False  # creating an optimizer slot (no broadcast of its initial value)

    # ---- variables -------------------------------------------------------------------------------
    def _create_variable(self, next_creator, **kwargs):
        if kwargs.get("colocate_with") is not None and not (self._sc_internal or self._sc_internal_init):
            # an optimizer slot: each replica's own optimizer state, initialised by the optimizer's constant
            # initializer on every worker; like our state, it is not broadcast (below)
            self._sc_internal_init = True
            try:
                return self._create_variable(next_creator, **kwargs)
            finally:
                self._sc_internal_init = False
        if self._sc_internal and isinstance(self, _cars.CollectiveAllReduceExtended):
            # our own state (the Δ_i, zeros on every worker): the mirrored creator; its initial value is
            # not broadcast (_get_variable_creator_initial_value)
            return _ms.MirroredExtended._create_variable(self, next_creator, **kwargs)
        if not self._sc_internal:
            _keras_hooks.refuse_keras3()  # a Keras 3 layer/optimizer would train without skipping
            _keras_hooks.adopt_callers()  # the tf-keras optimizer / model creating it reaches this strategy
        v = super()._create_variable(next_creator, **kwargs)
        if type(v) is _values.MirroredVariable and not self._sc_internal:
            v.__class__ = MeanReadMirroredVariable
        if not self._sc_internal and isinstance(v, _values.DistributedVariable):
            self._sc_vars.append(weakref.ref(v))
        return v

    @_no_autograph
    def _get_variable_creator_initial_value(self, replica_id, device, primary_var, **kwargs):
        if self._sc_internal or self._sc_internal_init:
            # our own state and optimizer slots start from constants on every worker: MultiWorkerMirrored's
            # broadcast from the chief would send each model-sized buffer over the slow link in the first
            # call (on 4 workers as 2 hosts at 100 Mbit/s: 5-7 s per 40 MB buffer)
            return _ms.MirroredExtended._get_variable_creator_initial_value(
                self, replica_id, device, primary_var, **kwargs
            )
        return super()._get_variable_creator_initial_value(replica_id, device, primary_var, **kwargs)

    def _sc_live_vars(self) -> List[Any]:
        return [v for v in (r() for r in self._sc_vars) if v is not None]

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

    def _sc_build_period(self) -> None:
        """period="time": the count table and x₀ store; host_interval: the hosts and their collective
        keys (both need the replicas, so after construction)."""
        if self.host_interval is not None and self.two_level is None:
            host_of = two_level.resolve_hosts(self, self._sc_hosts)
            key_base = container_strategy(self)._collective_key_base + 50_000
            h = self.host_interval
            if isinstance(self.interval_state, TwoLevelIntervalState):  # h chosen at run time: a variable
                h = self.interval_state.bind(len(set(host_of)))
            self.two_level = two_level.TwoLevelAverager(self, host_of, h, key_base)
        if self._sc_period is not None and self.time_period is None:
            self.time_period = TimePeriodState(
                self, self._sc_period, int(self.interval_state.interval.numpy())
            )

    # ---- state ------------------------------------------------------------------------------------
    @_no_autograph
    def _sc_state(self, optimizer: Any, var_list: Sequence[Any]) -> SkipCorrectState:
        state = self._sc_states.get(id(optimizer))
        if state is None:
            return self._sc_new_state(optimizer, var_list)
        known = {id(v) for v in state.variables}
        if any(id(v) not in known for v in var_list):
            raise _pass_through(
                InputError(
                    "apply_gradients got a variable that was not in its first call; SkipCorrectStrategy "
                    "keeps one correction per variable of the first list",
                    where="SkipCorrectStrategy",
                )
            )
        return state

    def _sc_new_state(self, optimizer: Any, var_list: Sequence[Any]) -> SkipCorrectState:
        with tf.init_scope():
            beta = float(optimizer_momentum(optimizer))
            nesterov = bool(getattr(optimizer, "nesterov", False))
            rule = _corr.resolve_correction(self._sc_correction, type(optimizer).__name__, beta, nesterov)
            compressed_sync.check_rule(self.compression, rule, type(optimizer).__name__)
            self._sc_internal = True
            try:
                state = SkipCorrectState(
                    container_strategy(self),
                    list(var_list),
                    rule,
                    optimizer,
                    compression=self.compression,
                    two_level=self.two_level is not None,
                )
                if self.time_period is not None:
                    self.time_period.new_state(state)
            finally:
                self._sc_internal = False
            self._sc_states[id(optimizer)] = state
            track_child(optimizer, state, "skip_correct_state")
        if state.rule == "vrl" and self._sc_correction_lr == "optimizer" and beta > 0:
            warn_once(
                "momentum",
                f"SkipCorrectStrategy: vrl with heavy-ball momentum {beta:g} and "
                "correction_lr='optimizer' (the rule as stated) over-corrects by up to 1/(1-momentum) "
                "and can diverge; consider correction_lr='effective' (docs/skip_correct.md)",
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
            return original(optimizer, pairs, name=name, **no_aggregation(legacy))
        grads = [g for g, _ in live]
        var_list = [v for _, v in live]
        new_grads = ctx.merge_call(self._sc_prepare_grads, args=(optimizer, var_list, grads))
        result = original(optimizer, list(zip(new_grads, var_list)), name=name, **no_aggregation(legacy))
        ctx.merge_call(self._sc_after_step, args=(optimizer, var_list))
        return result

    @_no_autograph
    def _sc_prepare_grads(self, strategy: Any, optimizer: Any, var_list: Sequence[Any], grads: Sequence[Any]):
        """Cross-replica: R·g_i − Δ_i per replica (local phase) or the SUM all-reduce (warm-up)."""
        state = self._sc_state(optimizer, var_list)
        if self.time_period is not None:  # which replicas are idle at this step, and copies of their state
            local_phase = tf.cast(optimizer.iterations, tf.int64) + 1 > self._sc_warmup
            self.time_period.before_apply(state, optimizer, state.local_steps.read_value(), local_phase)
        if state.compression is None:
            return local_gradients(self, state, optimizer, var_list, grads, self._sc_warmup)
        with tf.control_dependencies([compressed_sync.anchor_op(state, optimizer, self._sc_warmup)]):
            return local_gradients(self, state, optimizer, var_list, grads, self._sc_warmup)

    @_no_autograph
    def _sc_after_step(self, strategy: Any, optimizer: Any, var_list: Sequence[Any]) -> None:
        """Cross-replica: count the step; at k == H average (and correct)."""
        state = self._sc_states[id(optimizer)]
        t = tf.cast(optimizer.iterations, tf.int64)  # read after the optimizer's increment
        undo = self.time_period.after_apply() if self.time_period is not None else []
        # the clock starts once the step's work is done: its first variable updated (the backward pass's
        # last gradient); ``t`` alone is not, as the iterations increment is not ordered after the updates
        done = [c.read_value() for v in list(var_list)[:1] for c in getattr(v, "values", (v,))]
        with tf.control_dependencies([t] + undo + done):
            self._sc_step_bookkeeping(optimizer, state, t)

    @_no_autograph
    def _sc_step_bookkeeping(self, optimizer: Any, state: SkipCorrectState, t: tf.Tensor) -> None:
        tel, ivs = self.telemetry, self.interval_state
        step_dt = tel.step_time()
        steps = tel.steps.assign_add(1)
        local_phase = t > self._sc_warmup
        k = state.local_steps.read_value() + tf.cast(local_phase, tf.int64)
        if self.time_period is not None:
            self.time_period.after_step(state, local_phase, step_dt)
        do_sync = tf.logical_and(local_phase, k >= ivs.effective(steps))
        var_list = state.variables  # every variable of the state, also those without a gradient this step
        extras = self._sc_extra_vars(var_list, optimizer)

        def sync() -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
            dt, sample = self._sc_scheduled_sync(optimizer, state, list(var_list) + extras, k)
            return tf.constant(0, tf.int64), dt, sample

        def skip() -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
            return k, tf.constant(0.0, tf.float64), tf.constant(0.0, tf.float64)

        host_synced = None
        if self.two_level is not None:  # between global syncs, every h-th local step: the host sync
            do_host = tf.logical_and(local_phase, tf.math.floormod(k, self.two_level.h) == 0)
            host_synced = tf.logical_and(do_host, tf.logical_not(do_sync))
            host = functools.partial(self._sc_host_sync, optimizer, state, list(var_list) + extras, k)
            skip = functools.partial(tf.cond, do_host, host, skip)
        new_k, _, comm_sample = tf.cond(do_sync, sync, skip)
        state.local_steps.assign(new_k)
        deps = [new_k]
        if ivs.auto:
            # a t_comm sample: the sync's all-reduce (with overlap: the background one applied at this sync)
            sampled = tf.logical_and(do_sync, comm_sample > 0) if self._sc_overlap else do_sync
            agree = functools.partial(averaging.agree, self)
            with tf.control_dependencies([new_k]):
                comm_total = tel.comm_s.read_value()
                chosen = ivs.record(steps, step_dt, sampled, comm_sample, comm_total, agree, host_synced)
            deps.append(chosen)
            # Δ was estimated over the probe's short periods: start it over for the chosen H
            deps.append(tf.cond(chosen > 0, state.restart_corrections, lambda: tf.constant(0, tf.int64)))
        with tf.control_dependencies(deps):
            tel.last_end.assign(tf.timestamp())

    def _sc_lr(self, optimizer: Any, state: SkipCorrectState) -> Any:
        """The vrl update's learning rate (None for other rules): read in a sync branch, not every step."""
        if state.rule != "vrl":
            return None
        lr = optimizer_lr(optimizer)
        if self._sc_correction_lr == "effective":
            lr = lr / (1.0 - optimizer_momentum(optimizer))
        return lr

    @_no_autograph
    def _sc_host_sync(
        self, optimizer: Any, state: SkipCorrectState, variables: List[Any], k: tf.Tensor
    ) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """The host sync of two-level averaging (``two_level.py``): k unchanged, its seconds as the sample."""
        lr = self._sc_lr(optimizer, state)
        dt = two_level_sync.host_sync(self.two_level, variables, state, len(state.variables), lr)
        with tf.control_dependencies([dt]):
            return tf.identity(k), tf.constant(0.0, tf.float64), tf.identity(dt)

    @_no_autograph
    def _sc_scheduled_sync(
        self, optimizer: Any, state: SkipCorrectState, variables: List[Any], k: tf.Tensor
    ) -> Tuple[tf.Tensor, tf.Tensor]:
        """The sync at k == H: blocking (``averaging.average``) or overlapped. Returns (seconds the step
        spent, the t_comm sample: the blocking sync's seconds or the applied background all-reduce's)."""
        lr = self._sc_lr(optimizer, state)
        n = len(state.variables)
        self.sync_payload_bytes = compressed_sync.payload_bytes(variables, n, state.rule, state.compression)
        if self.two_level is not None:  # host means, then across hosts (two_level.py)
            dt = two_level_sync.global_sync(self.two_level, variables, state, n, k, lr)
            return dt, dt
        if self.time_period is not None:  # normalised average of unequal step counts (unequal_sync.py)
            dt = self.time_period.sync(state, variables, n, k, lr)
            return dt, dt
        if self._sc_overlap:  # apply the in-flight mean, snapshot and launch the next one (overlap.py)
            scale = tf.cast(k, tf.float64) * (tf.cast(lr, tf.float64) if lr is not None else 1.0)
            dt, bg = self._sc_overlapper(state, variables, n).sync(scale, k)
            self.telemetry.add_sync(dt, background=bg)
            return dt, bg
        if state.compression is not None:
            dt = compressed_sync.average(self, variables, state, n_trainable=n, local_steps=k, lr=lr)
            return dt, dt
        dt = averaging.average(self, variables, state=state, n_trainable=n, local_steps=k, lr=lr)
        return dt, dt

    @_no_autograph
    def _sc_overlapper(
        self, state: SkipCorrectState, variables: List[Any], n_trainable: int
    ) -> OverlapAverager:
        """The overlapped averaging of ``state`` (built at the first trace of its sync)."""
        avg = self._sc_overlappers.get(id(state))
        if avg is None:
            avg = OverlapAverager(self, container_strategy(self), variables, n_trainable, state)
            self._sc_overlappers[id(state)] = avg
        elif not avg.same_layout(variables):
            raise _pass_through(
                InputError(
                    "the averaged variables changed between two traces of the training step (e.g. "
                    "optimizer slots created later); overlap=True needs a fixed set",
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

    # ---- out-of-rhythm sync -----------------------------------------------------------------------
    def replicas_equal(self) -> bool:
        """Whether every replica already holds the last global model: no local step since the last
        scheduled sync (or warm-up step) of any optimizer, and no averaging in flight (eager)."""
        states = list(self._sc_states.values())
        if not states or self._sc_overlap:
            return False
        return all(int(s.local_steps.numpy()) == 0 for s in states)

    def sync_now(self) -> None:
        """Average every replica's model now (no Δ update, the H rhythm is kept). With overlap, the
        in-flight averaging is applied first (its Δ update included). Nothing is sent when the
        replicas already hold the last global model (:meth:`replicas_equal`)."""
        if self.replicas_equal():
            return
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
        if self.two_level is not None:  # across the hosts once per host value, as the scheduled syncs
            two_level_sync.global_sync(self.two_level, trainable + extras, None, 0, None, None)
        else:
            averaging.average(self, trainable + extras)
        compressed_sync.mark_stale(states)  # x₀ is this average now: taken at the next local step
        self.telemetry.reset_clock()


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
