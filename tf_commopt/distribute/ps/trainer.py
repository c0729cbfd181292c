"""``ParameterServerSkipCorrect``: skip-and-correct rounds on a TensorFlow parameter-server cluster.

A round is one closure per data shard (``closure.py``, H local steps on a worker, scheduled with
``ClusterCoordinator.schedule`` on whichever worker is free), then one averaging function on the ps
(``averaging.py``). The trainer holds the counters and the history and decides what each round is:
its kind (``plan.py``), its length (``run_round(steps=m)``, m <= H), H itself (``auto_interval.py``),
and what a lost task means (``failures.py``). See docs/parameter_server.md for the exact rule.

Example (the chief of a TF_CONFIG cluster with ``chief``, ``worker`` and ``ps`` tasks)::

    trainer = ParameterServerSkipCorrect(interval=4, correction="vrl", learning_rate=0.05)
    with trainer.scope():                          # variables live on the ps tasks
        model = tf_keras.Sequential([...])
    trainer.compile(model, loss=tf_keras.losses.MeanSquaredError(),
                    batch_fn=array_batch_fn(x, y, num_shards=2, batch_size=64))
    for r in range(100):
        info = trainer.run_round()                 # H local steps per shard, then one averaging
"""

from __future__ import annotations

import sys
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from tf_commopt._compat import ps_cluster_spec, unblock_coordinator_exit
from tf_commopt.core.tfconfig import tf_config_from_env
from tf_commopt.distribute.correction import resolve_correction, validate_correction, validate_correction_lr
from tf_commopt.distribute.ps import checkpoints
from tf_commopt.distribute.ps.auto_interval import IntervalProbe
from tf_commopt.distribute.ps.averaging import make_apply
from tf_commopt.distribute.ps.closure import make_closure
from tf_commopt.distribute.ps.data import as_source
from tf_commopt.distribute.ps.failures import FailureWatch
from tf_commopt.distribute.ps.forward import model_forward
from tf_commopt.distribute.ps.plan import RoundPlan, ps_can_finish
from tf_commopt.distribute.ps.probe import wait_for_tasks
from tf_commopt.distribute.ps.rules import UpdateRule, sgd_rule, update_rule
from tf_commopt.distribute.ps.state import build_state, checkpoint
from tf_commopt.distribute.ps.telemetry import round_record, summary
from tf_commopt.errors import InputError

__all__ = ["ParameterServerSkipCorrect", "trainer_for"]

# id(strategy) -> the trainer built on it (ps fit finds a model's trainer by model.distribute_strategy)
_TRAINERS: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()


def trainer_for(strategy: Any) -> Optional["ParameterServerSkipCorrect"]:
    """The ParameterServerSkipCorrect whose ``scope()`` is ``strategy`` (None if there is none).

    >>> trainer_for(None) is None
    True
    """
    t = _TRAINERS.get(id(strategy))
    return t if t is not None and t.strategy is strategy else None


def _check_sgd_args(learning_rate: Optional[float], momentum: Optional[float]) -> None:
    if learning_rate is not None and (
        isinstance(learning_rate, bool)
        or not isinstance(learning_rate, (int, float))
        or not learning_rate > 0
    ):
        raise InputError(f"must be a number > 0, got {learning_rate!r}", where="learning_rate")
    if momentum is not None and (
        isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0 <= momentum < 1
    ):
        raise InputError(f"must be in [0, 1), got {momentum!r}", where="momentum")


def _strategy_from_tf_config(connect_timeout_s: float) -> tf.distribute.ParameterServerStrategy:
    """A ParameterServerStrategy from TF_CONFIG, once every worker and ps task listens (chief only)."""
    tfc = tf_config_from_env()
    if tfc is None or not tfc.num_ps or tfc.task_type != "chief":
        raise InputError(
            "ParameterServerSkipCorrect runs on the chief of a TF_CONFIG cluster with ps tasks",
            where="TF_CONFIG",
        )
    wait_for_tasks(tfc.cluster, connect_timeout_s)
    return tf.distribute.ParameterServerStrategy(tf.distribute.cluster_resolver.TFConfigClusterResolver())


class ParameterServerSkipCorrect:
    """Skip-and-correct (or SSGD: interval 1, correction none) on a TF parameter-server cluster.

    Args:
        interval: H, local steps per round (int >= 1), or "auto": ``probe_rounds`` rounds with H = 1, then
            H = clip(round(t_comm / (target_ratio x t_comp)), 1, max_interval) from their median
            communication time per round and local-step time (the first round, which ships the
            function, is left out), fixed for the rest of the run (SkipCorrectStrategy's rule).
        correction: "auto" (default: resolved by ``compile`` from the optimizer: "vrl" for plain SGD,
            "gradient" otherwise), "vrl", "gradient" (D_i = (G_i - mean_j G_j) / m from the raw gradient sums
            G_i of the round's m local steps; any optimizer) or "none".
        learning_rate: lr of the local SGD steps (constant; default 0.05) when ``compile`` gets no optimizer.
        momentum: SGD momentum (Keras form v <- mu v - lr g; x <- x + v), buffer kept per shard on the ps
            (default 0) when ``compile`` gets no optimizer.
        strategy: an existing ``tf.distribute.ParameterServerStrategy``; default: one from TF_CONFIG.
        round_timeout_s: the longest a round may take before ClusterError (never a hang).
        connect_timeout_s: how long to wait for every worker and ps task to listen before building the
            strategy from TF_CONFIG (ClusterError naming the missing tasks otherwise).
        correction_lr: the lr in the vrl update: "effective" (default: lr / (1 - mu), as SkipCorrectStrategy;
            exactly lr for plain SGD) or "optimizer" (lr itself, which over-corrects with momentum).
        target_ratio, max_interval, probe_rounds: ``interval="auto"`` (``auto_interval.py``).

    Example:
        >>> t = ParameterServerSkipCorrect(interval=1, correction="none")   # doctest: +SKIP (chief only)
    """

    def __init__(
        self,
        interval: Union[int, str] = 4,
        correction: str = "auto",
        learning_rate: Optional[float] = None,
        momentum: Optional[float] = None,
        strategy: Any = None,
        round_timeout_s: float = 120.0,
        connect_timeout_s: float = 300.0,
        correction_lr: str = "effective",
        target_ratio: float = 1.0,
        max_interval: int = 256,
        probe_rounds: int = 3,
    ):
        self._auto: Optional[IntervalProbe] = None
        if interval == "auto":  # H = 1 rounds first; then H from their measured comm / compute times
            self._auto = IntervalProbe(target_ratio, max_interval, probe_rounds)
            interval = 1
        elif isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise InputError(f"must be an integer >= 1 or 'auto', got {interval!r}", where="interval")
        validate_correction(correction)
        _check_sgd_args(learning_rate, momentum)
        self._sgd_args = (learning_rate, momentum)  # the SGD rule of compile() without an optimizer
        self._correction_arg = correction  # "auto" is resolved by compile(), from the optimizer
        self.correction_lr = validate_correction_lr(correction_lr, where="correction_lr")
        self.strategy = strategy if strategy is not None else _strategy_from_tf_config(connect_timeout_s)
        cluster = ps_cluster_spec(self.strategy)
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(self.strategy)
        unblock_coordinator_exit(self.coordinator)
        self.interval, self.correction = interval, correction
        self.learning_rate = float(learning_rate) if learning_rate is not None else 0.05
        self.momentum = float(momentum) if momentum is not None else 0.0
        self.round_timeout_s = float(round_timeout_s)
        self.num_workers, self.num_ps = len(cluster.get("worker", [])), len(cluster.get("ps", []))
        self._watch = FailureWatch(cluster, round_timeout_s, self.num_workers)
        self._compiled = False
        self.rounds = 0
        self.steps_done = 0  # local steps per shard so far (= rounds x H for a fixed H)
        self.history: List[Dict[str, Any]] = []
        _TRAINERS[id(self.strategy)] = self

    @property
    def compiled(self) -> bool:
        """Whether :meth:`compile` has run."""
        return self._compiled

    @property
    def probe_rounds(self) -> Optional[int]:
        """``interval="auto"``: the rounds at H = 1 before H is chosen (None for a fixed interval)."""
        return self._auto.probe_rounds if self._auto is not None else None

    @property
    def lost_workers(self) -> set:
        """Workers currently seen lost (they ran no shard and do not answer)."""
        return self._watch.lost_workers

    @property
    def rejoined_workers(self) -> List[int]:
        """Workers seen lost and later running shards again, in order."""
        return self._watch.rejoined_workers

    def scope(self):
        """``strategy.scope()``: variables created here live on the ps tasks."""
        return self.strategy.scope()

    # ------------------------------------------------------------------------------------------ build
    def _rule(self, optimizer: Any) -> UpdateRule:
        if optimizer is None:
            lr0, mu0 = self._sgd_args
            return sgd_rule(0.05 if lr0 is None else lr0, 0.0 if mu0 is None else mu0)
        if self._sgd_args != (None, None):
            raise InputError(
                "pass learning_rate and momentum in the optimizer, not to ParameterServerSkipCorrect as well",
                where="optimizer",
            )
        return update_rule(optimizer)

    def compile(
        self,
        model: Any = None,
        loss: Optional[Callable] = None,
        batch_fn: Optional[Callable] = None,
        num_shards: Optional[int] = None,
        variables: Optional[Sequence] = None,
        loss_fn: Optional[Callable] = None,
        optimizer: Any = None,
        metrics: Optional[Sequence[Tuple[str, Callable]]] = None,
    ) -> None:
        """Set up the per-shard state on the ps and trace the round functions.

        Args:
            model, loss: a tf-keras model (built in ``scope()``) and ``loss(y_true, y_pred)``; or
            variables, loss_fn: variables (made in ``scope()``) and ``loss_fn(params, x, y)``.
            batch_fn: ``batch_fn(shard, step) -> (x, y)``, run on the worker (e.g. :func:`array_batch_fn`),
                or a source with ``open(shard, step0)`` (``DatasetFnSource``).
            num_shards: K; default: the batch_fn's ``num_shards``, else the number of workers.
            optimizer: a tf-keras optimizer (SGD, Adam, RMSprop, Adagrad; ``rules.py``) for the local steps,
                its slots kept per shard on the ps; default: SGD with the constructor's ``learning_rate``
                and ``momentum``. It resolves ``correction="auto"``: ``vrl`` for plain SGD, else ``gradient``.
            metrics: ``(name, fn(y_true, y_pred) -> per-example values)`` pairs, averaged over each round's
                local steps and shards into ``run_round()["metrics"]`` (the model's, before each update).

        Example:
            >>> trainer.compile(model, loss=tf_keras.losses.MeanSquaredError(),
            ...                 batch_fn=array_batch_fn(x, y, num_shards=2, batch_size=32))   # doctest: +SKIP
        """
        variables, forward = model_forward(model, loss, variables, loss_fn, metrics)
        if batch_fn is None:
            raise InputError(
                "batch_fn= is required (e.g. array_batch_fn(x, y, num_shards, batch_size))", where="compile"
            )
        k = num_shards or getattr(batch_fn, "num_shards", None) or self.num_workers
        if not isinstance(k, int) or k < 1:
            raise InputError(f"num_shards must be a positive integer, got {k!r}", where="compile")
        rule = self._rule(optimizer)
        if self._compiled:
            raise InputError(
                "this trainer is compiled already; build a new ParameterServerSkipCorrect for another "
                "model (set_data() changes the data)",
                where="compile",
            )
        self.rule, self.learning_rate, self.momentum = rule, rule.constant_lr, rule.momentum
        self.correction = resolve_correction(self._correction_arg, rule.name, rule.momentum, rule.nesterov)
        self.num_shards, self.variables, self.model = k, variables, model
        self._forward = forward
        self.metric_names = [name for name, _ in (metrics or ())]
        self._ps_finish = ps_can_finish(rule, self.correction)
        self._eff = 1.0 / (1.0 - rule.momentum) if self.correction_lr == "effective" else 1.0
        local_slots = self.interval > 1 or self._auto is not None or not self._ps_finish
        self._state = build_state(self.strategy, variables, rule, self.correction, k, local_slots)
        self.param_bytes = self._state.param_bytes
        self._source = as_source(batch_fn)
        self._trace(self.interval)
        self._compiled = True

    def set_data(self, batch_fn: Any) -> None:
        """Train on other data from now on (the ps state, corrections and slots are kept): re-traces once.

        Example:
            >>> trainer.set_data(array_batch_fn(x2, y2, num_shards=2, batch_size=32))   # doctest: +SKIP
        """
        self._require_compiled("set_data")
        k = getattr(batch_fn, "num_shards", None)
        if k is not None and k != self.num_shards:
            raise InputError(f"the data has {k} shards, the trainer {self.num_shards}", where="set_data")
        self._source = as_source(batch_fn)
        self._trace(self.interval)

    def _require_compiled(self, what: str) -> None:
        if not self._compiled:
            raise InputError(f"call compile() before {what}()", where="ParameterServerSkipCorrect")

    def _trace(self, h: int) -> None:
        """Build and trace the round functions for interval ``h`` (a new H re-traces them once)."""
        plan = RoundPlan(h, self.correction, self._ps_finish, len(self.rule.slots))
        self.bytes_per_round = plan.bytes_per_round(self.num_shards, self.param_bytes)
        shards = list(range(self.num_shards)) if getattr(self._source, "per_shard", False) else [None]
        self._closures = [
            make_closure(
                plan,
                self.variables,
                self._state,
                self._forward,
                self.rule,
                self._source,
                s,
                len(self.metric_names),
            )
            for s in shards
        ]
        self._apply = make_apply(plan, self.variables, self._state, self.rule, self._eff)
        t0 = time.perf_counter()  # trace now, so the first round's time is shipping + running, not tracing
        spec = (tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.int32))
        with self.strategy.scope():
            for c in self._closures:
                c.get_concrete_function(*spec)
        self._apply.get_concrete_function(
            tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.int64)
        )
        self.trace_s = time.perf_counter() - t0

    # ---------------------------------------------------------------------------------------- rounds
    def _round_steps(self, steps: Optional[int]) -> int:
        m = self.interval if steps is None else steps
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or not 1 <= m <= self.interval:
            raise InputError(
                f"must be an integer in [1, interval={self.interval}], got {steps!r}", where="steps"
            )
        return int(m)

    def run_round(self, steps: Optional[int] = None) -> Dict[str, Any]:
        """One round: K closures of H local steps each (or ``steps`` <= H, e.g. the last round of an epoch:
        the same traced functions), then the averaging on the ps.

        Returns:
            The round's record: ``round, loss, metrics, workers`` (the worker each shard ran on),
            ``compute_s, comm_s, bytes, interval, steps`` (and ``idle_workers, lost_workers`` when a worker
            ran no shard).

        Example:
            >>> rec = trainer.run_round()          # doctest: +SKIP
        """
        self._require_compiled("run_round")
        m = self._round_steps(steps)
        lr_sum = tf.constant(self.rule.lr_sum(self.steps_done, m), tf.float32)  # the vrl update's sum of lr
        t0 = time.perf_counter()
        step0 = tf.constant(self.steps_done, tf.int64)  # batch (shard i, step t) is fixed: t = step0 + j
        nsteps = tf.constant(m, tf.int32)
        rvs = [
            self.coordinator.schedule(
                self._closures[i % len(self._closures)], args=(tf.constant(i, tf.int32), step0, nsteps)
            )
            for i in range(self.num_shards)
        ]
        self._watch.join(self.coordinator, f"round {self.rounds}", self.rounds)
        outs = [rv.fetch() for rv in rvs]
        t1 = time.perf_counter()
        self._apply(nsteps, lr_sum, step0)
        rec = round_record(
            self.rounds,
            outs,
            self.metric_names,
            m,
            self.interval,
            self.bytes_per_round,
            t1 - t0,
            time.perf_counter() - t1,
        )
        self._watch.after_round(rec, self.num_shards)
        self.rounds += 1
        self.steps_done += m
        self.history.append(rec)
        if self._auto is not None and self._auto.due(self.rounds):
            self._choose_interval()
        return rec

    def _choose_interval(self) -> None:
        """interval="auto": fix H from the probe rounds (``auto_interval.py``); re-trace for it."""
        t0 = time.perf_counter()
        h = self._auto.choose(self.history)
        if h != self.interval:
            self.interval = h
            self._trace(h)
        self._auto.policy.overhead_s += time.perf_counter() - t0
        st = self._auto.stats()
        sys.stderr.write(
            f"tf_commopt: interval auto: t_comm {st['interval_t_comm_s'] * 1e3:.1f} ms per round, t_comp "
            f"{st['interval_t_comp_s'] * 1e3:.2f} ms per step -> H = {h} from round {self.rounds}\n"
        )
        sys.stderr.flush()

    def train(
        self, rounds: int, log: Optional[Callable[[Dict[str, Any]], None]] = None
    ) -> List[Dict[str, Any]]:
        """``rounds`` x ``run_round()``; ``log(record)`` after each. Returns the records."""
        out = []
        for _ in range(rounds):
            rec = self.run_round()
            if log:
                log(rec)
            out.append(rec)
        return out

    # ------------------------------------------------------------------------------------ checkpoints
    def save(self, directory: str, keep: int = 2) -> str:
        """Write the global model, every D_i, the per-shard optimizer slots and the round counter to
        ``directory/round-R`` (chief, between rounds; ``checkpoints.py``); the newest ``keep`` are kept.

        Example:
            >>> path = trainer.save("/tmp/ps_backup")   # doctest: +SKIP  -> /tmp/ps_backup/round-12
        """
        self._require_compiled("save")
        meta = {
            "rounds": self.rounds,
            "steps": self.steps_done,
            "interval": self.interval,
            "auto": self._auto is not None,
            "correction": self.correction,
            "optimizer": self.rule.name,
        }
        return checkpoints.write(directory, checkpoint(self.variables, self._state, self.rule), meta, keep)

    def restore_latest(self, directory: str) -> int:
        """Load the newest ``round-R`` checkpoint of ``directory`` (from :meth:`save`); returns R (0: none).

        One-line InputError naming the checkpoint if it is truncated, corrupt or from another model,
        interval or correction. The next ``run_round()`` is round R, exactly as in the uninterrupted run.

        Example:
            >>> start = trainer.restore_latest("/tmp/ps_backup")   # doctest: +SKIP
        """
        self._require_compiled("restore_latest")
        ckpt = checkpoint(self.variables, self._state, self.rule)
        meta = checkpoints.read_latest(
            directory,
            ckpt,
            lambda saved: checkpoints.check_same_run(
                saved, self.rule.name, self._auto is not None, self.correction, self.interval
            ),
        )
        if meta is None:
            return 0
        done = int(meta["rounds"])
        self.rounds, self.steps_done = done, int(meta.get("steps", done * self.interval))
        if self._auto is not None and done >= self._auto.probe_rounds:  # keep the H chosen before the save
            self._auto.restore(int(meta["interval"]))
            if int(meta["interval"]) != self.interval:
                self.interval = int(meta["interval"])
                self._trace(self.interval)
        return self.rounds

    # ------------------------------------------------------------------------------------------ reads
    def corrections(self) -> List[np.ndarray]:
        """The D_i (one [K, ...] array per variable); zeros for correction "none"."""
        if self._state.corrections:
            return [c.numpy() for c in self._state.corrections]
        return [
            np.zeros([self.num_shards] + v.shape.as_list(), v.dtype.as_numpy_dtype) for v in self.variables
        ]

    def stats(self) -> Dict[str, Any]:
        """``interval, steps, syncs, comm_s, compute_s, bytes_communicated`` (SkipCorrectStrategy's keys),
        ``first_round_s``, ``median_round_s`` and, for ``interval="auto"``, ``interval_t_comm_s``,
        ``interval_t_comp_s``, ``interval_overhead_s``.

        Over the rounds run by this process; what each means: ``telemetry.py``.
        """
        auto = self._auto.stats() if self._auto is not None else {}
        return {**auto, **summary(self.history, self.interval, self.steps_done, self.rounds)}
