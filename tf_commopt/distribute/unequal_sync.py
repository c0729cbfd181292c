"""``SkipCorrectStrategy(period="time")``: every replica steps for the same wall budget, the sync averages
normalised updates (the mechanism; the rule is ``core/unequal.py``, the counts ``core/period.py``).

Global steps k = 1..H still make a period on every worker (tf-keras, the graph loop, checkpoints and
callbacks count them as in ``period="steps"``), but replica i *applies* only the last τ_i of them:
at a step with k local steps already done it is idle while k < H − τ_i. An idle step changes nothing
on that replica — its model, optimizer slots and gradient sum are put back — and when every replica of
a worker is idle, the graph loop does not run the step at all (:meth:`TimePeriodState.idle_hooks`: no
forward, no backward, no input batch), so a worker k times slower reaches the sync at about the same
wall time as the fastest. The sync (k == H) is FedNova's normalised average with the corrections
re-derived per step (docs/skip_correct.md, "Workers of different speeds"), from one fused SUM
all-reduce of p_i·d_i (and p_i·G_i/τ_i for ``gradient``), d_i = (x₀ − x_i)/τ_i, p_i = 1/R; x₀, the
model at the last sync, is kept per variable and checkpointed. When every τ_i equals H the sync is
``averaging.average``, so equal counts are ``period="steps"`` bit for bit.

The counts: :class:`~tf_commopt.core.period.TimeBudget` with fixed ``step_times`` gives them once; else
each worker's mean seconds per local step (its own clock from the start of a call or the previous step
to the step's end, syncs excluded; each earlier period weighted half as much as the next) is agreed at
every sync in one small SUM all-reduce (a one-hot row per replica) and
:meth:`~tf_commopt.core.period.TimePeriod.steps` gives the next period's τ_i on every worker.

Example:
    >>> strategy = SkipCorrectStrategy(interval=16, period="time")   # doctest: +SKIP
    >>> strategy.stats()["period_steps"]                              # doctest: +SKIP
    [16, 8, 16, 8]
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tf_commopt._compat import container_strategy, host_variable, optimizer_slots, worker_index
from tf_commopt.core import unequal as _rule
from tf_commopt.core.period import TimeBudget
from tf_commopt.distribute import averaging
from tf_commopt.errors import InputError

__all__ = ["TimePeriodState"]

_no_autograph = tf.autograph.experimental.do_not_convert


def _after(ops: List[Any], logs: Any) -> Any:
    """``logs`` once ``ops`` ran."""
    with tf.control_dependencies(ops):
        return tf.nest.map_structure(tf.identity, logs)


class TimePeriodState:
    """The time-based period of one strategy: the count table, x₀, idle masks, the unequal sync.

    Args:
        ext: the strategy's StrategyExtended (built: its replicas are known).
        budget: the :class:`TimeBudget` options.
        interval: H (fixed).
    """

    def __init__(self, ext: Any, budget: TimeBudget, interval: int) -> None:
        self.ext, self.budget, self.h = ext, budget, int(interval)
        strategy = container_strategy(ext)
        self.r = int(strategy.num_replicas_in_sync)
        self.n_local = len(ext.worker_devices)
        self.offset = worker_index(strategy) * self.n_local
        times = budget.step_times
        if times is not None and len(times) != self.r:
            raise InputError(
                f"{len(times)} step times for {self.r} replicas (one per replica of the cluster)",
                where="SkipCorrectStrategy(period=TimeBudget(step_times=...))",
            )
        counts = budget.counts(self.h) if times is not None else (self.h,) * self.r
        self.measured = times is None
        self.counts = host_variable(np.array(counts, np.int64), tf.int64, "skip_correct/period_steps")
        self.times = host_variable(
            np.array(times if times is not None else [0.0] * self.r, np.float64),
            tf.float64,
            "skip_correct/step_times",
        )
        self.comp_s = host_variable(0.0, tf.float64, "skip_correct/period_comp_s")
        self.timed = host_variable(0.0, tf.float64, "skip_correct/period_timed_steps")
        self.taken = host_variable(np.zeros(self.n_local, np.int64), tf.int64, "skip_correct/real_steps")
        self.x0: Dict[int, List[Any]] = {}  # id(state) -> one mirrored variable per state variable
        self._masks: Dict[Any, Tuple[List[tf.Tensor], List[Any]]] = {}

    # ---- state ------------------------------------------------------------------------------------
    def new_state(self, state: Any) -> None:
        """x₀ for ``state``'s variables: the model now (every replica holds the same model here)."""
        with container_strategy(self.ext).scope():
            self.x0[id(state)] = [
                tf.Variable(
                    v.values[0].read_value(),
                    trainable=False,
                    name=f"skip_correct/x0_{j}",
                    synchronization=tf.VariableSynchronization.ON_WRITE,
                    aggregation=tf.VariableAggregation.NONE,
                )
                for j, v in enumerate(state.variables)
            ]

    def _local_counts(self) -> List[tf.Tensor]:
        table = self.counts.read_value()
        return [table[self.offset + i] for i in range(self.n_local)]

    # ---- the step ---------------------------------------------------------------------------------
    @_no_autograph
    def before_apply(self, state: Any, optimizer: Any, k: tf.Tensor, local_phase: tf.Tensor) -> None:
        """Cross-replica, before the optimizer's apply: which local replicas are idle this step (k: local
        steps done this period), and a copy of what an idle replica's apply will change."""
        h = tf.constant(self.h, tf.int64)
        idle = [tf.logical_and(local_phase, k < h - c) for c in self._local_counts()]
        watched = list(state.variables) + list(optimizer_slots(optimizer))
        watched += list(state.grad_sums or [])
        snaps = []
        for i, flag in enumerate(idle):
            comps = [v.values[i] for v in watched]

            def copy(comps: List[Any] = comps) -> List[tf.Tensor]:
                return [tf.identity(c.read_value()) for c in comps]

            def nothing(comps: List[Any] = comps) -> List[tf.Tensor]:
                return [tf.zeros([0], c.dtype) for c in comps]

            with tf.device(comps[0].device):
                snaps.append(tf.cond(flag, copy, nothing))  # one cond per replica, empty when it works
        self._masks[tf.compat.v1.get_default_graph()] = (idle, [watched, snaps])

    @_no_autograph
    def after_apply(self) -> List[Any]:
        """Cross-replica, after the apply: put an idle replica's model, slots and G_i back; count the
        replicas' real steps. Returns the ops."""
        idle, (watched, snaps) = self._masks.pop(tf.compat.v1.get_default_graph())
        ops = []
        for i, flag in enumerate(idle):
            comps = [v.values[i] for v in watched]

            def put_back(comps: List[Any] = comps, saved: List[Any] = snaps[i]) -> Any:
                return tf.group([c.assign(tf.reshape(s, tf.shape(c))) for c, s in zip(comps, saved)])

            with tf.device(comps[0].device):
                ops.append(tf.cond(flag, put_back, tf.no_op))
        with tf.control_dependencies(ops):
            active = tf.stack([tf.cast(tf.logical_not(f), tf.int64) for f in idle])
            ops.append(self.taken.assign_add(active, read_value=False))
        return ops

    @_no_autograph
    def after_step(self, state: Any, local_phase: tf.Tensor, step_dt: tf.Tensor) -> None:
        """Bookkeeping of an executed step: a warm-up step moves x₀ with the model; a timed local step
        adds its seconds to this period's clock."""
        x0 = self.x0[id(state)]

        def follow() -> tf.Tensor:
            ops = [
                c.assign(v.values[i].read_value())
                for v, x in zip(state.variables, x0)
                for i, c in enumerate(x.values)
            ]
            with tf.control_dependencies(ops):
                return tf.constant(0, tf.int64)

        if self.ext._sc_warmup > 0:
            tf.cond(local_phase, lambda: tf.constant(0, tf.int64), follow)
        if self.measured:
            timed = tf.logical_and(local_phase, step_dt > 0.0)
            self.comp_s.assign_add(tf.where(timed, step_dt, tf.constant(0.0, tf.float64)))
            self.timed.assign_add(tf.cast(timed, tf.float64))

    # ---- the sync ---------------------------------------------------------------------------------
    @_no_autograph
    def sync(
        self, state: Any, variables: Sequence[Any], n_trainable: int, k: tf.Tensor, lr: Any
    ) -> tf.Tensor:
        """The sync at k == H (cross-replica): today's average when every τ_i is H, else the normalised
        one; then x₀ ← x⁺ and, when measured, the next period's counts. Returns its seconds."""
        table = self.counts.read_value()
        equal = tf.reduce_all(tf.equal(table, self.h))

        def same() -> tf.Tensor:
            return averaging.average(
                self.ext, variables, state=state, n_trainable=n_trainable, local_steps=k, lr=lr
            )

        def unequal() -> tf.Tensor:
            return self._normalised(state, variables, n_trainable, table, lr)

        dt = tf.cond(equal, same, unequal)
        x0 = self.x0[id(state)]
        with tf.control_dependencies([dt]):
            ops = [
                c.assign(v.values[i].read_value())
                for v, x in zip(state.variables, x0)
                for i, c in enumerate(x.values)
            ]
        if self.measured:
            with tf.control_dependencies(ops):
                ops.append(self._refresh())
        with tf.control_dependencies(ops):
            return tf.identity(dt)

    @_no_autograph
    def _normalised(
        self, state: Any, variables: Sequence[Any], n: int, table: tf.Tensor, lr: Any
    ) -> tf.Tensor:
        """x⁺ = x₀ − τ_eff·Σ_i p_i d_i from one fused SUM all-reduce (core/unequal.py's worker_share /
        from_sums); vrl Δ_i += (d_i − Σ p d)/clr; gradient Δ_i = G_i/τ_i − Σ p G/τ, G_i ← 0; the other
        averaged state (BatchNorm statistics, slots) by its plain mean."""
        t0 = tf.timestamp()
        p = 1.0 / self.r
        rule = state.rule
        sums = state.grad_sum_components() if rule == "gradient" else None
        x0 = [list(x.values) for x in self.x0[id(state)]]
        local = [table[self.offset + i] for i in range(self.n_local)]
        with tf.control_dependencies([t0]):
            xs = [[c.read_value() for c in v.values] for v in variables]
            gs = [[c.read_value() for c in row] for row in sums] if sums is not None else None
        shares, ds = [], []
        for j in range(n):
            row_s, row_d = [], []
            for i in range(self.n_local):
                with tf.device(xs[j][i].device):
                    tau = tf.cast(local[i], xs[j][i].dtype)
                    g = gs[j][i] if gs is not None else None
                    d_part, _, g_part = _rule.worker_share(x0[j][i].read_value(), xs[j][i], tau, p, g)
                    row_s.append((d_part, g_part))
                    row_d.append((x0[j][i].read_value() - xs[j][i]) / tau)
            shares.append(row_s)
            ds.append(row_d)
        parts = [[s[0] for s in row] for row in shares]
        if gs is not None:
            parts += [[s[1] for s in row] for row in shares]
        parts += [[x * tf.cast(p, x.dtype) for x in xs[j]] for j in range(n, len(variables))]
        reduced = averaging.fused_reduce(self.ext, tf.distribute.ReduceOp.SUM, parts)
        counts = tf.cast(table, tf.float64)  # τ_eff: Σ_i p_i τ_i (p_i = 1/R) or max_i τ_i
        tau_eff = tf.reduce_max(counts) if self.budget.tau_eff == "max" else tf.reduce_mean(counts)
        deltas = state.delta_components()
        ops = []
        for j, v in enumerate(variables):
            for i, c in enumerate(v.values):
                with tf.device(c.device):
                    if j >= n:
                        ops.append(c.assign(reduced[n * (2 if gs is not None else 1) + j - n][i]))
                        continue
                    d_sum = reduced[j][i]
                    new_x = _rule.from_sums(x0[j][i].read_value(), d_sum, tf.cast(tau_eff, c.dtype))
                    if deltas is not None and rule == "vrl":
                        delta = deltas[j][i]
                        upd = delta.read_value() + (ds[j][i] - d_sum) / tf.cast(lr, c.dtype)
                        ops.append(delta.assign(upd))
                    elif deltas is not None and rule == "gradient":
                        tau = tf.cast(local[i], c.dtype)
                        ops.append(deltas[j][i].assign(gs[j][i] / tau - reduced[n + j][i]))
                        ops.append(sums[j][i].assign(tf.zeros_like(gs[j][i])))
                    ops.append(c.assign(new_x))
        with tf.control_dependencies(ops):
            t1 = tf.timestamp()
        self.ext.telemetry.add_sync(t1 - t0)
        return t1 - t0

    @_no_autograph
    def _refresh(self) -> tf.Tensor:
        """Agree on the seconds per step of the period that ended (one SUM all-reduce of one-hot rows)
        and set the next period's counts (:meth:`TimeBudget.counts`); a worker with no timed step keeps
        its old entry (no counts until every worker has one)."""
        mine = self.comp_s.read_value() / tf.maximum(self.timed.read_value(), 1e-9)
        mine = tf.where(self.timed.read_value() > 0, mine, tf.constant(0.0, tf.float64))
        rows = []
        for i, d in enumerate(self.ext.worker_devices):
            with tf.device(d):
                rows.append(tf.one_hot(self.offset + i, self.r, dtype=tf.float64) * mine)
        value = averaging.regroup(rows)
        agreed = averaging.components(
            self.ext.reduce_to(tf.distribute.ReduceOp.SUM, value, destinations=value)
        )[0]
        agreed = tf.where(agreed > 0.0, agreed, self.times.read_value())
        budget, h = self.budget, self.h

        def policy(times: np.ndarray) -> np.ndarray:
            return np.array(budget.counts(h, [float(t) for t in times]), np.int64)

        def update() -> tf.Tensor:
            with tf.device("/CPU:0"):
                counts = tf.reshape(tf.numpy_function(policy, [agreed], tf.int64, stateful=True), [self.r])
            with tf.control_dependencies([self.counts.assign(counts), self.times.assign(agreed)]):
                return tf.constant(0, tf.int64)

        done = tf.cond(tf.reduce_all(agreed > 0.0), update, lambda: tf.constant(0, tf.int64))
        with tf.control_dependencies([done]):  # older periods count half as much at every sync
            return tf.group(self.comp_s.assign(self.comp_s * 0.5), self.timed.assign(self.timed * 0.5))

    # ---- the graph loop's idle steps --------------------------------------------------------------
    def idle_hooks(self, optimizer: Any, state: Any, warmup_steps: int) -> Tuple[Any, Any, Any]:
        """``(begin, now, skip)`` for the graph loop: ``begin(logs)`` starts the step clock at the call's
        start (the gap since the last call is Python, no step's work); ``now()`` is true at a step at
        which every local replica is idle (k < H − max τ_i, after the warm-up: the leading steps of a
        period); ``skip(logs, idle)`` counts the step without running it when ``idle`` (t, k, the
        strategy's steps; the next step's clock starts here). Both return ``logs``."""
        h = tf.constant(self.h, tf.int64)
        tel = self.ext.telemetry

        def begin(logs: Any) -> Any:
            if not self.measured:
                return logs
            return _after([tel.last_end.assign(tf.timestamp(), read_value=False)], logs)

        def now() -> tf.Tensor:
            t = tf.cast(optimizer.iterations, tf.int64) + 1
            k = state.local_steps.read_value()
            busiest = tf.reduce_max(tf.stack(self._local_counts()))
            return tf.logical_and(t > warmup_steps, k < h - busiest)

        def skip(logs: Any, idle: tf.Tensor) -> Any:
            one = tf.cast(idle, tf.int64)
            ops = [
                optimizer.iterations.assign_add(tf.cast(one, optimizer.iterations.dtype), read_value=False),
                state.local_steps.assign_add(one, read_value=False),
                tel.steps.assign_add(one, read_value=False),
            ]
            if self.measured:  # the gap since the last step is no step's
                with tf.control_dependencies(ops):
                    stamp = tf.where(idle, tf.timestamp(), tel.last_end.read_value())
                    ops.append(tel.last_end.assign(stamp, read_value=False))
            return _after(ops, logs)

        return begin, now, skip

    # ---- checkpoints and stats --------------------------------------------------------------------
    def checkpoint_tensors(self, state: Any) -> Dict[str, tf.Tensor]:
        """x₀ (one copy: every replica holds the same) and the count and time tables."""
        out = {"period_steps": self.counts.read_value(), "period_step_times": self.times.read_value()}
        for j, x in enumerate(self.x0.get(id(state), [])):
            with tf.device("/CPU:0"):
                out["x0_%d" % j] = tf.identity(x.values[0].read_value())
        return out

    def restore_ops(self, state: Any, restored: Dict[str, Any]) -> List[Any]:
        """Assign x₀ and (when measured) the tables from a checkpoint written with ``period="time"``."""
        x0 = self.x0.get(id(state), [])
        if x0 and "x0_0" not in restored:
            raise InputError(
                "checkpoint has no x0 (written with period='steps'?); period='time' needs the model at "
                "the last sync",
                where="SkipCorrectStrategy restore",
            )
        ops = [c.assign(restored["x0_%d" % j]) for j, x in enumerate(x0) for c in x.values]
        if self.measured and "period_steps" in restored:
            ops += [
                self.counts.assign(restored["period_steps"]),
                self.times.assign(restored["period_step_times"]),
            ]
        return ops

    def as_dict(self) -> Dict[str, Any]:
        """``period_steps`` (τ_i of every replica for the coming period), ``period_step_times_s`` (the
        table they came from), ``real_steps`` (steps each local replica applied), ``tau_eff``."""
        return {
            "period": "time",
            "tau_eff": self.budget.tau_eff,
            "period_steps": [int(c) for c in self.counts.numpy()],
            "period_step_times_s": [round(float(t), 6) for t in self.times.numpy()],
            "real_steps": [int(c) for c in self.taken.numpy()],
        }
