"""Skip-and-correct training on a parameter-server cluster (TF_CONFIG with ``chief``, ``worker``, ``ps``).

Example (the same script runs on every task; see docs/parameter_server.md)::

    from tf_commopt.distribute import parameter_server as psc
    psc.serve_unless_chief()                       # worker / ps tasks serve here (ps_serve.py), exit with the chief
    trainer = psc.ParameterServerSkipCorrect(interval=4, correction="vrl", learning_rate=0.05)
    with trainer.scope():                          # variables live on the ps tasks
        model = tf_keras.Sequential([...])
    trainer.compile(model, loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    batch_fn=psc.array_batch_fn(x, y, num_shards=2, batch_size=64))
    for r in range(100):
        info = trainer.run_round()                 # H local steps per shard, then one averaging
    print(trainer.stats())

For ``model.fit`` with the user's tf-keras optimizer see ``ps_fit.py``; ``compile(optimizer=...)`` runs
any optimizer of ``ps_rules.py`` (SGD, Adam, RMSprop, Adagrad) in the local steps below, with its slots
kept per shard on the ps, and ``correction="gradient"`` (the default for every optimizer but plain SGD)
sets D_i = (G_i - mean_j G_j) / m after a round of m local steps, G_i the sum of shard i's raw gradients
in the round. ``run_round(steps=m)`` runs a shorter round (m <= H) with the same traced functions.

The rule (thesis 001, skip-and-correct; the correction is VRL-SGD, Liang et al. 2019, "Variance
Reduced Local SGD with Lower Communication Complexity"), written here for SGD. K data shards, interval
H, learning rate lr, momentum mu (0 = plain SGD); the global model x lives on the ps tasks, with, per
shard i, the correction D_i (starts at 0) and, if mu > 0, the momentum buffer v_i (kept per shard, "local" slots).
Round r (steps t = rH+1 .. rH+H) is one closure per shard i, scheduled with
``ClusterCoordinator.schedule`` on whichever worker is free:

* x_i <- x (read from the ps); H times: g = grad of the loss of x_i on batch (i, t) of shard i;
  v_i <- mu v_i - lr (g - D_i); x_i <- x_i + v_i;
* the closure writes its delta s_i = x_i - x into slot i on the ps (an assignment: a rescheduled
  closure rewrites the same slot, so the result does not depend on which worker ran it). For H = 1
  it writes its gradient g instead, and the ps finishes the step (same numbers, fewer bytes).

After all K closures: x <- x + mean_i s_i (= mean_i x_i) and, for ``correction="vrl"``,
D_i <- D_i + (x_new - x_i) / (H lr') = D_i + (mean_j s_j - s_i) / (H lr') (H lr': the sum of lr' over
the round's steps with a schedule), so sum_i D_i stays 0, where lr' = lr / (1 - mu) (``correction_lr="effective"``, the default; = lr for plain SGD) or lr ("optimizer"). Both run
on the ps (the chief only issues the call). With H = 1 and ``correction="none"`` this is synchronous
SGD with global batch K x batch_size (momentum included: the mean of the per-shard buffers follows the
global momentum recursion exactly).

Workers are stateless between rounds (every closure starts from the ps), so a worker lost mid-round
costs only its closure (at most H undelivered local steps): TensorFlow's coordinator re-runs it on
another worker (re-scheduled, never skipped) and the round result is unchanged; closures are
idempotent (v_i is read from one slot and written to another), so sum_i D_i = 0 over the K shards
holds whoever ran them. A restarted worker (same address) is taken back by the coordinator and pulls
the global model like any closure. Every wait is bounded by ``round_timeout_s``; a round that cannot
finish raises ClusterError with one line saying which (a lost ps task: named, with the last completed
round; ``save(dir)`` between rounds and ``restore_latest(dir)`` on a fresh cluster resume exactly).
See docs/parameter_server.md, "Worker and ps failures".
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from tf_commopt import use_tf_keras  # noqa: E402

use_tf_keras()  # before TensorFlow loads: tf.keras is tf-keras
import tensorflow as tf  # noqa: E402

from tf_commopt._compat import keras_all_layers, unblock_coordinator_exit
from tf_commopt.core.interval import FirstIterationPolicy
from tf_commopt.core.tfconfig import TFConfig, tf_config_from_env
from tf_commopt.distribute.correction import (
    CORRECTIONS,
    gradient_delta,
    resolve_correction,
    validate_correction,
    validate_correction_lr,
    vrl_delta_update,
)
from tf_commopt.distribute.ps_rules import UpdateRule, sgd_rule, update_rule
from tf_commopt.distribute.ps_serve import _reachable, serve, serve_unless_chief
from tf_commopt.errors import ClusterError, InputError

__all__ = [
    "serve",
    "serve_unless_chief",
    "array_batch_fn",
    "ParameterServerSkipCorrect",
    "CORRECTIONS",
    "trainer_for",
    "UpdateRule",
]


# --------------------------------------------------------------------------------------------------- data
def array_batch_fn(
    x: np.ndarray,
    y: np.ndarray,
    num_shards: int,
    batch_size: int,
    shard_indices: Optional[Sequence[Sequence[int]]] = None,
) -> Callable:
    """A ``batch_fn(shard, step) -> (x, y)`` over in-memory arrays, evaluated on the worker.

    Example:
        >>> fn = array_batch_fn(np.arange(8.0)[:, None], np.arange(8), num_shards=2, batch_size=2)  # doctest: +SKIP

    Shard i holds rows i, i + K, i + 2K, ... (K = ``num_shards``), or the rows ``shard_indices[i]``
    in that order (e.g. a label-skewed split; every shard is cut to the shortest one's length n);
    step t (0-based, counted over rounds) of shard i takes its rows (t B .. t B + B - 1) mod n.
    The arrays become constants of the round function (shipped to each worker once, with the
    function), so this is for data sets of up to a few hundred MB; pass your own ``batch_fn``
    (e.g. reading files on the worker) for larger ones.
    """
    x, y = np.asarray(x), np.asarray(y)
    if len(x) != len(y):
        raise InputError(f"x has {len(x)} rows but y has {len(y)}", where="array_batch_fn")
    if not isinstance(num_shards, int) or num_shards < 1 or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(
            f"num_shards and batch_size must be positive integers, got {num_shards!r}, {batch_size!r}",
            where="array_batch_fn",
        )
    if shard_indices is None:
        shard_indices = [np.arange(i, len(x), num_shards) for i in range(num_shards)]
    elif len(shard_indices) != num_shards:
        raise InputError(
            f"shard_indices has {len(shard_indices)} shards, num_shards is {num_shards}",
            where="array_batch_fn",
        )
    n = min(len(ix) for ix in shard_indices) if num_shards else 0
    if n < 1:
        raise InputError(f"{len(x)} rows cannot fill {num_shards} shards", where="array_batch_fn")
    xs = np.stack([x[np.asarray(ix)[:n]] for ix in shard_indices])
    ys = np.stack([y[np.asarray(ix)[:n]] for ix in shard_indices])

    consts: List[Any] = [None, None, None]  # (graph, x, y) of the function being traced

    def batch_fn(shard, step):
        graph = tf.compat.v1.get_default_graph()
        if consts[0] is not graph:  # one copy per traced function, however many local steps use it
            consts[:] = [graph, tf.constant(xs), tf.constant(ys)]  # traced in: shipped with the function
        cx, cy = consts[1], consts[2]
        rows = tf.math.floormod(
            tf.cast(step, tf.int64) * batch_size + tf.range(batch_size, dtype=tf.int64), n
        )
        return tf.gather(cx[shard], rows), tf.gather(cy[shard], rows)

    batch_fn.num_shards = num_shards  # type: ignore[attr-defined]
    return batch_fn


# ------------------------------------------------------------------------------------- keras model call
def _weight_slots(model) -> List[Tuple[Any, str]]:
    """(layer, attribute) holding each trainable variable, so the model can run on plain tensors."""
    where = {id(v): k for k, v in enumerate(model.trainable_variables)}
    slots: List[Optional[Tuple[Any, str]]] = [None] * len(where)
    for layer in keras_all_layers(model):
        for attr, val in vars(layer).items():
            k = where.get(id(val))
            if k is not None and slots[k] is None:
                slots[k] = (layer, attr)
    missing = [model.trainable_variables[k].name for k, s in enumerate(slots) if s is None]
    if missing:
        raise InputError(
            f"variable {missing[0]} is not a plain layer attribute; pass variables= and loss_fn= "
            "(a function of the weight tensors) instead of a Keras model",
            where="compile",
        )
    return slots  # type: ignore[return-value]


def _keras_forward(model, loss, metrics: Sequence[Tuple[str, Callable]] = ()) -> Callable:
    """``forward(params, x, y) -> (loss, metric values)``: the model run on the tensors ``params``; each metric
    ``fn(y_true, y_pred)`` (per-example values) averaged over the batch (float64, shape [len(metrics)])."""
    slots = _weight_slots(model)

    def forward(params, x, y):
        saved = [getattr(layer, attr) for layer, attr in slots]
        try:
            for (layer, attr), p in zip(slots, params):
                object.__setattr__(layer, attr, p)  # bypass tracking: only for this trace
            pred = model(x, training=True)
        finally:
            for (layer, attr), v in zip(slots, saved):
                object.__setattr__(layer, attr, v)
        # a Keras Loss object refuses AUTO reduction under a strategy: take its per-example values
        per_example = (
            loss.call(y, pred) if hasattr(loss, "call") and hasattr(loss, "reduction") else loss(y, pred)
        )
        values = [tf.reduce_mean(tf.cast(tf.stop_gradient(fn(y, pred)), tf.float64)) for _, fn in metrics]
        return tf.reduce_mean(per_example), tf.stack(values) if values else tf.zeros([0], tf.float64)

    return forward


def _saved_rounds(directory: str) -> List[int]:
    """Rounds with a complete checkpoint in ``directory`` (a ``round-R`` directory appears by rename)."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(n[6:]) for n in names if n.startswith("round-") and n[6:].isdigit())


class _BatchFnSource:
    """Batches from a ``batch_fn(shard, step) -> (x, y)``: step t of shard i is fixed, whoever runs it."""

    per_shard = False  # one closure for every shard (the shard is a tensor argument)

    def __init__(self, batch_fn: Callable) -> None:
        self.batch_fn = batch_fn
        self.num_shards = getattr(batch_fn, "num_shards", None)

    def open(self, shard: Any, step0: Any) -> Callable:
        return lambda j: self.batch_fn(shard, step0 + tf.cast(j, tf.int64))


# id(strategy) -> the trainer compiled on it (ps_fit.fit finds a model's trainer by model.distribute_strategy)
_TRAINERS: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()


def trainer_for(strategy: Any) -> Optional["ParameterServerSkipCorrect"]:
    """The ParameterServerSkipCorrect whose ``scope()`` is ``strategy`` (None if there is none).

    >>> trainer_for(None) is None
    True
    """
    t = _TRAINERS.get(id(strategy))
    return t if t is not None and t.strategy is strategy else None


# -------------------------------------------------------------------------------------------- strategy
def _wait_for_tasks(tfc: TFConfig, timeout_s: float) -> None:
    """Wait until every worker and ps task listens (TensorFlow would block without saying on what)."""
    end = time.monotonic() + timeout_s
    while True:
        down = [
            f"{job} {i} ({a})"
            for job in ("ps", "worker")
            for i, a in enumerate(tfc.cluster.get(job, []))
            if not _reachable(a)
        ]
        if not down:
            return
        if time.monotonic() > end:
            raise ClusterError(
                f"cluster tasks not listening after {timeout_s:g} s (connect_timeout_s): {', '.join(down)}"
            )
        time.sleep(0.5)


class ParameterServerSkipCorrect:
    """Skip-and-correct (or SSGD: interval 1, correction none) on a TF parameter-server cluster.

    Example:
        >>> t = ParameterServerSkipCorrect(interval=1, correction="none")   # doctest: +SKIP (chief only)

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
        correction_lr: the lr in the vrl update: "effective" (default: lr / (1 - mu), as SkipCorrectStrategy;
            exactly lr for plain SGD) or "optimizer" (lr itself, which over-corrects with momentum).
        strategy: an existing ``tf.distribute.ParameterServerStrategy``; default: one from TF_CONFIG.
        round_timeout_s: the longest a round may take before ClusterError (never a hang).
        connect_timeout_s: how long to wait for every worker and ps task to listen before building the
            strategy from TF_CONFIG (ClusterError naming the missing tasks otherwise).
    """

    def __init__(
        self,
        interval: Union[int, str] = 4,
        correction: str = "auto",
        learning_rate: Optional[float] = None,
        momentum: Optional[float] = None,
        strategy=None,
        round_timeout_s: float = 120.0,
        connect_timeout_s: float = 300.0,
        correction_lr: str = "effective",
        target_ratio: float = 1.0,
        max_interval: int = 256,
        probe_rounds: int = 3,
    ):
        self._auto: Optional[FirstIterationPolicy] = None
        if interval == "auto":  # H = 1 rounds first; then H from their measured comm / compute times
            if isinstance(probe_rounds, bool) or not isinstance(probe_rounds, int) or probe_rounds < 2:
                raise InputError(f"must be an integer >= 2, got {probe_rounds!r}", where="probe_rounds")
            self._auto = FirstIterationPolicy(
                target_ratio=target_ratio, max_interval=max_interval, warmup_steps=1
            )
            self.probe_rounds = probe_rounds
            interval = 1
        elif isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise InputError(f"must be an integer >= 1 or 'auto', got {interval!r}", where="interval")
        validate_correction(correction)
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
        self._sgd_args = (learning_rate, momentum)  # the SGD rule of compile() without an optimizer
        self._correction_arg = correction  # "auto" is resolved by compile(), from the optimizer
        self.correction_lr = validate_correction_lr(correction_lr, where="correction_lr")
        if strategy is None:
            tfc = tf_config_from_env()
            if tfc is None or not tfc.num_ps or tfc.task_type != "chief":
                raise InputError(
                    "ParameterServerSkipCorrect runs on the chief of a TF_CONFIG cluster with ps tasks",
                    where="TF_CONFIG",
                )
            _wait_for_tasks(tfc, connect_timeout_s)
            resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
            strategy = tf.distribute.ParameterServerStrategy(resolver)
        self.strategy = strategy
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        unblock_coordinator_exit(self.coordinator)
        self.interval, self.correction = interval, correction
        self.learning_rate = float(learning_rate) if learning_rate is not None else 0.05
        self.momentum = float(momentum) if momentum is not None else 0.0
        self.round_timeout_s = float(round_timeout_s)
        self.num_workers = int(strategy.extended._num_workers)  # pylint: disable=protected-access
        self.num_ps = int(strategy.extended._num_ps)  # pylint: disable=protected-access
        self._compiled = False
        self.rounds = 0
        self.steps_done = 0  # local steps per shard so far (= rounds x H for a fixed H)
        self._stats = {"comm_s": 0.0, "compute_s": 0.0, "bytes_communicated": 0}
        self.history: List[Dict[str, Any]] = []
        self.lost_workers: set = set()
        self.rejoined_workers: List[int] = []  # workers seen lost and later running shards again, in order
        _TRAINERS[id(strategy)] = self

    def scope(self):
        """``strategy.scope()``: variables created here live on the ps tasks."""
        return self.strategy.scope()

    # ------------------------------------------------------------------------------------------ build
    def compile(
        self,
        model=None,
        loss: Optional[Callable] = None,
        batch_fn: Optional[Callable] = None,
        num_shards: Optional[int] = None,
        variables: Optional[Sequence] = None,
        loss_fn: Optional[Callable] = None,
        optimizer: Any = None,
        metrics: Optional[Sequence[Tuple[str, Callable]]] = None,
    ) -> None:
        """Set up the round function. Either a tf-keras ``model`` (built in ``scope()``) and
        ``loss(y_true, y_pred)``, or ``variables`` (made in ``scope()``) and ``loss_fn(params, x, y)``.
        ``batch_fn(shard, step) -> (x, y)`` runs on the worker (or a data source with ``open(shard, step0)``,
        e.g. ``ps_fit.DatasetFnSource``); ``num_shards`` defaults to the batch_fn's ``num_shards`` or
        the number of workers. ``optimizer``: a tf-keras optimizer (SGD, Adam, RMSprop, Adagrad; see
        ``ps_rules.py``) for the local steps, with one slot per shard on the ps; default: SGD with the
        constructor's ``learning_rate`` and ``momentum``. ``correction="auto"`` is resolved here: ``vrl``
        for plain SGD, ``gradient`` for every other optimizer (as SkipCorrectStrategy). ``metrics``:
        ``(name, fn(y_true, y_pred) -> per-example values)`` pairs, averaged over each round's local
        steps and shards into ``run_round()["metrics"]`` (the model's, before each local update)."""
        if model is not None:
            import tf_keras

            if not isinstance(model, tf_keras.Model):
                raise InputError(
                    f"model must be a tf-keras model (import tf_keras, or TF_USE_LEGACY_KERAS=1 before "
                    f"tensorflow), got {type(model).__module__}.{type(model).__name__}; Keras 3 does "
                    "not work under ParameterServerStrategy",
                    where="compile",
                )
            if loss is None:
                raise InputError("a Keras model needs loss=", where="compile")
            if (
                model.losses
            ):  # kernel/activity regularizers: their terms read the variables, not the local copies
                raise InputError(
                    f"models with regularization losses ({len(model.losses)}) are not supported by the "
                    "parameter-server variant; drop the regularizers or add the term to the loss",
                    where="compile",
                )
            if model.non_trainable_weights:
                raise InputError(
                    f"non-trainable weights ({model.non_trainable_weights[0].name}) are not supported "
                    "by the parameter-server variant",
                    where="compile",
                )
            variables = list(model.trainable_variables)
            forward = _keras_forward(model, loss, list(metrics or ()))
        elif variables is not None and loss_fn is not None:
            if metrics:
                raise InputError("metrics= needs a Keras model", where="compile")
            variables = list(variables)

            def forward(params, x, y):
                return loss_fn(params, x, y), tf.zeros([0], tf.float64)
        else:
            raise InputError("pass model= and loss=, or variables= and loss_fn=", where="compile")
        if batch_fn is None:
            raise InputError(
                "batch_fn= is required (e.g. array_batch_fn(x, y, num_shards, batch_size))", where="compile"
            )
        k = num_shards or getattr(batch_fn, "num_shards", None) or self.num_workers
        if not isinstance(k, int) or k < 1:
            raise InputError(f"num_shards must be a positive integer, got {k!r}", where="compile")
        if optimizer is not None:
            if self._sgd_args != (None, None):
                raise InputError(
                    "pass learning_rate and momentum in the optimizer, not to ParameterServerSkipCorrect "
                    "as well",
                    where="optimizer",
                )
            rule = update_rule(optimizer)
        else:
            lr0, mu0 = self._sgd_args
            rule = sgd_rule(0.05 if lr0 is None else lr0, 0.0 if mu0 is None else mu0)
        if self._compiled:
            raise InputError(
                "this trainer is compiled already; build a new ParameterServerSkipCorrect for another "
                "model (set_data() changes the data)",
                where="compile",
            )
        self.rule = rule
        self.learning_rate = rule.constant_lr  # None with a schedule
        self.momentum = rule.momentum
        self.correction = resolve_correction(self._correction_arg, rule.name, rule.momentum, rule.nesterov)
        self.num_shards, self.variables, self.model = k, variables, model
        self._forward = forward
        self.metric_names = [name for name, _ in (metrics or ())]
        mu, vrl, grad_corr = rule.momentum, self.correction == "vrl", self.correction == "gradient"
        # H = 1 plain SGD / momentum with a constant lr: the workers push g_i and the ps finishes the step
        self._ps_finish = (
            rule.name == "SGD"
            and not rule.nesterov
            and rule.schedule is None
            and self.correction in ("none", "vrl")
        )
        self._eff = 1.0 / (1.0 - mu) if self.correction_lr == "effective" else 1.0  # vrl: lr' = lr x eff

        def per_shard(v, name, init=0.0):
            with tf.device(v.device):
                return tf.Variable(
                    tf.fill([k] + v.shape.as_list(), tf.cast(init, v.dtype)),
                    trainable=False,
                    name=f"{name}_{v.name.split(':')[0].replace('/', '_')}",
                )

        with self.strategy.scope():
            self._slots = [per_shard(v, "delta_slot") for v in variables]
            self._corr = [per_shard(v, "correction") for v in variables] if vrl or grad_corr else []
            self._gsum = [per_shard(v, "grad_sum") for v in variables] if grad_corr else []
            # per optimizer slot (SGD: momentum; Adam: m, v; ...) one [K, ...] variable per model variable
            self._opt = [
                [per_shard(v, name, init) for v in variables]
                for name, init in zip(rule.slots, rule.slot_init)
            ]
            # closures write their slots here, never into _opt, which they read: a closure re-run after a worker
            # died half-way through its writes reads the same slots again (idempotent); apply() copies
            need_out = bool(rule.slots) and (
                self.interval > 1 or self._auto is not None or not self._ps_finish
            )
            self._opt_out = (
                [[per_shard(v, name + "_out") for v in variables] for name in rule.slots] if need_out else []
            )
        self._mom = self._opt[0] if rule.name == "SGD" and rule.slots else []  # SGD's v_i (ps-finish path)
        self.param_bytes = int(sum(v.shape.num_elements() * v.dtype.size for v in variables))
        self._set_source(batch_fn)
        self._trace = self._make_trace()
        self._trace(self.interval)
        self._compiled = True

    def _set_source(self, batch_fn: Any) -> None:
        self._source = batch_fn if hasattr(batch_fn, "open") else _BatchFnSource(batch_fn)

    def set_data(self, batch_fn: Any) -> None:
        """Train on other data from now on (the ps state, corrections and slots are kept): re-traces once.

        Example:
            >>> trainer.set_data(array_batch_fn(x2, y2, num_shards=2, batch_size=32))   # doctest: +SKIP
        """
        if not self._compiled:
            raise InputError("call compile() before set_data()", where="ParameterServerSkipCorrect")
        k = getattr(batch_fn, "num_shards", None)
        if k is not None and k != self.num_shards:
            raise InputError(f"the data has {k} shards, the trainer {self.num_shards}", where="set_data")
        self._set_source(batch_fn)
        self._trace(self.interval)

    def _make_trace(self) -> Callable[[int], None]:
        rule, variables, forward, k = self.rule, self.variables, self._forward, self.num_shards
        mu, vrl, grad_corr = rule.momentum, self.correction == "vrl", self.correction == "gradient"
        const_lr = rule.constant_lr
        n_slots = len(rule.slots)
        n_metrics = len(self.metric_names)

        def trace(h: int) -> None:  # the round functions for interval h (a new h re-traces them once)
            # H = 1: push the gradient and let the ps finish the step -- plain SGD / momentum (constant lr, none or
            # vrl: per shard, then the mean, = the mean step by linearity), or any optimizer without correction
            # (synchronous: the mean gradient, one update of slots kept identical in every shard's row)
            sync_rule = h == 1 and not self._ps_finish and self.correction == "none"
            local = not (h == 1 and self._ps_finish) and not sync_rule
            # pull x, push s_i (or g_i); pull D_i [vrl, gradient]; push G_i [gradient]; pull + push each slot
            per_closure = 2 if not local else 2 + int(vrl or grad_corr) + int(grad_corr) + 2 * n_slots
            self.bytes_per_round = k * per_closure * self.param_bytes
            source = self._source

            def make_closure(fixed_shard: Optional[int]):
                @tf.function(autograph=False)  # explicit tf.while_loop; AutoGraph could not convert it anyway
                def closure(shard, step0, nsteps):
                    x0 = [tf.identity(v) for v in variables]  # pull x from the ps
                    corr = (
                        [tf.gather(c, shard) for c in self._corr]
                        if self._corr and local
                        else [tf.zeros_like(p) for p in x0]
                    )
                    slots = [[tf.gather(s, shard) for s in per_var] for per_var in self._opt] if local else []
                    flat = [s for per_var in slots for s in per_var]
                    with tf.control_dependencies(x0 + corr + flat):
                        t0 = tf.timestamp()
                    batches = source.open(shard if fixed_shard is None else fixed_shard, step0)
                    xs = [tf.identity(p) for p in x0]
                    gsum = [tf.zeros_like(p) for p in x0] if grad_corr else []

                    # slots as [slot][var] -> per var lists for the rule
                    def local_step(j, xs, slots, gsum, loss_sum):
                        bx, by = batches(j)
                        with tf.GradientTape() as tape:
                            tape.watch(xs)
                            loss_v, mvals = forward(xs, bx, by)
                        grads = tape.gradient(loss_v, xs)
                        loss_sum = loss_sum + tf.concat([tf.cast(loss_v, tf.float64)[None], mvals], 0)
                        if not local:
                            return j + 1, grads, slots, gsum, loss_sum
                        step = step0 + tf.cast(
                            j, tf.int64
                        )  # global step before this one (optimizer.iterations)
                        lr = rule.lr(step)
                        new_xs, new_slots = [], [[] for _ in range(n_slots)]
                        for v, (p, g, c) in enumerate(zip(xs, grads, corr)):
                            p2, s2 = rule.apply(p, g - c, [slots[s][v] for s in range(n_slots)], lr, step + 1)
                            new_xs.append(p2)
                            for s in range(n_slots):
                                new_slots[s].append(s2[s])
                        if grad_corr:  # G_i: the raw gradients of the round, before the correction
                            gsum = [a + g for a, g in zip(gsum, grads)]
                        return j + 1, new_xs, new_slots, gsum, loss_sum

                    loss_sum = tf.zeros([1 + n_metrics], tf.float64)  # the loss, then each metric
                    if (
                        local
                    ):  # a loop, not H unrolled copies: tracing (and a new H's re-trace) does not grow with H
                        _, xs, slots, gsum, loss_sum = tf.while_loop(
                            lambda j, *_: j < nsteps,
                            local_step,
                            (tf.constant(0), xs, slots, gsum, loss_sum),
                            maximum_iterations=h,
                        )
                        xs, slots, gsum = list(xs), [list(s) for s in slots], list(gsum)
                    else:
                        _, xs, slots, gsum, loss_sum = local_step(tf.constant(0), xs, slots, gsum, loss_sum)
                    pushed = (
                        [p - q for p, q in zip(xs, x0)] if local else xs
                    )  # s_i (local) or g_i (ps finishes)
                    flat = [s for per_var in slots for s in per_var]
                    with tf.control_dependencies(pushed + flat + gsum):
                        t1 = tf.timestamp()

                    def put(var, value):
                        return var.scatter_update(tf.IndexedSlices(value[None], shard[None]))

                    writes = [put(s, d) for s, d in zip(self._slots, pushed)]
                    writes += [
                        put(o, b) for outs, news in zip(self._opt_out, slots) for o, b in zip(outs, news)
                    ]
                    writes += [put(o, b) for o, b in zip(self._gsum, gsum)]
                    with tf.control_dependencies(writes):
                        worker = tf.identity(
                            tf.distribute.coordinator.experimental_get_current_worker_index()
                        )
                    return worker, t1 - t0, loss_sum / tf.cast(nsteps, tf.float64)

                return closure

            @tf.function(autograph=False)
            def apply(nsteps, lr_sum, step0):
                m = tf.cast(nsteps, tf.float32)
                for idx, v in enumerate(variables):
                    with tf.device(v.device):  # on the ps that holds v
                        sv = self._slots[idx].read_value()
                        if (
                            sync_rule
                        ):  # the slots hold g_i: x <- U(x, mean_i g_i, slots, lr_s0, s0 + 1) on the ps
                            x_new, new = rule.apply(
                                v.read_value(),
                                tf.reduce_mean(sv, axis=0),
                                [per_var[idx][0] for per_var in self._opt],
                                rule.lr(step0),
                                step0 + 1,
                            )
                            for per_var, value in zip(self._opt, new):
                                per_var[idx].assign(tf.broadcast_to(value[None], tf.shape(per_var[idx])))
                            v.assign(x_new)
                            continue
                        if local:
                            for outs, ins in zip(
                                self._opt_out, self._opt
                            ):  # the closures' slots become the next round's
                                ins[idx].assign(outs[idx].read_value())
                        else:  # the slots hold g_i: finish the local (SGD) step here, s_i = x_i - x
                            step = sv - self._corr[idx].read_value() if self._corr else sv
                            if self._mom:
                                mom = self._mom[idx]
                                mom.assign(mu * mom - const_lr * step)
                                sv = mom.read_value()
                            else:
                                sv = -const_lr * step
                        mean = tf.reduce_mean(sv, axis=0)
                        v.assign_add(mean)
                        if (
                            vrl
                        ):  # D_i += (x_bar - x_i) / (sum of lr' over the round), x_bar - x_i = mean - s_i
                            c = self._corr[idx]
                            c.assign(
                                vrl_delta_update(
                                    c.read_value(),
                                    mean[None],
                                    sv,
                                    tf.cast(m, v.dtype),
                                    tf.cast(lr_sum * self._eff / m, v.dtype),
                                )
                            )
                        elif grad_corr:  # D_i = (G_i - mean_j G_j) / m  (sum_i D_i = 0)
                            gs = self._gsum[idx].read_value()
                            self._corr[idx].assign(
                                gradient_delta(gs, tf.reduce_mean(gs, axis=0)[None], tf.cast(m, v.dtype))
                            )
                return tf.constant(0)

            shards = list(range(k)) if getattr(source, "per_shard", False) else [None]
            closures = [make_closure(s) for s in shards]
            self._closures, self._apply = closures, apply
            t0 = (
                time.perf_counter()
            )  # trace now, so the first round's time is shipping + running, not tracing
            spec = (tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.int32))
            with self.strategy.scope():
                for c in closures:
                    c.get_concrete_function(*spec)
            apply.get_concrete_function(
                tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.int64)
            )
            self.trace_s = time.perf_counter() - t0

        return trace

    # ---------------------------------------------------------------------------------------- rounds
    def _join(self, what: str) -> None:
        errs: List[BaseException] = []

        def join():
            try:
                self.coordinator.join()
            except BaseException as e:  # pylint: disable=broad-except
                errs.append(e)

        th = threading.Thread(target=join, daemon=True)
        th.start()
        th.join(self.round_timeout_s)
        if th.is_alive():
            down = self._unreachable_tasks()
            self._raise_if_ps_lost(what, down)
            why = (
                f"unreachable: {', '.join(down)}"
                if down
                else "no live worker could run it, or a ps task is gone"
            )
            raise ClusterError(
                f"{what} did not finish within {self.round_timeout_s:g} s (round_timeout_s); {why}"
            )
        if errs:
            e = errs[0]
            down = self._unreachable_tasks()
            self._raise_if_ps_lost(what, down)
            first = " ".join(str(e).split())[:200]
            why = f"unreachable: {', '.join(down)}; " if down else ""
            raise ClusterError(f"{what} failed: {why}{type(e).__name__}: {first}") from None

    def _raise_if_ps_lost(self, what: str, down: List[str]) -> None:
        ps = [d for d in down if d.startswith("ps ")]
        if ps:
            raise ClusterError(
                f"{what} failed: parameter-server task {', '.join(ps)} is gone; the global model and "
                f"corrections lived there, so training stops (last completed round: {self.rounds}); "
                "restart the cluster and resume from the last save() (restore_latest(), or "
                "experiments.train --backup_dir)"
            ) from None

    def _unreachable_tasks(self) -> List[str]:
        spec = self._cluster_spec()
        return [
            f"{job} {i} ({a})"
            for job in ("ps", "worker")
            for i, a in enumerate(spec.get(job, []))
            if not _reachable(a)
        ]

    def run_round(self, steps: Optional[int] = None) -> Dict[str, Any]:
        """One round: K closures (H local steps each, or ``steps`` <= H: e.g. the last round of an epoch),
        then the averaging on the ps. Returns its record: ``round, loss, metrics, workers`` (the worker index each
        shard ran on), ``compute_s, comm_s, bytes, steps``. A shorter round uses the same traced functions."""
        if not self._compiled:
            raise InputError("call compile() before run_round()", where="ParameterServerSkipCorrect")
        m = self.interval if steps is None else steps
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or not 1 <= m <= self.interval:
            raise InputError(
                f"must be an integer in [1, interval={self.interval}], got {steps!r}", where="steps"
            )
        m = int(m)
        lr_sum = tf.constant(self.rule.lr_sum(self.steps_done, m), tf.float32)  # the vrl update's sum of lr
        t0 = time.perf_counter()
        step0 = tf.constant(self.steps_done, tf.int64)  # batch (shard i, step t) is fixed: t = step0 + j
        nsteps = tf.constant(m, tf.int32)
        closures = self._closures
        rvs = [
            self.coordinator.schedule(
                closures[i % len(closures)], args=(tf.constant(i, tf.int32), step0, nsteps)
            )
            for i in range(self.num_shards)
        ]
        self._join(f"round {self.rounds}")
        outs = [rv.fetch() for rv in rvs]
        t1 = time.perf_counter()
        self._apply(nsteps, lr_sum, step0)
        t2 = time.perf_counter()
        compute = max(float(o[1]) for o in outs)
        means = np.mean([np.asarray(o[2]) for o in outs], axis=0)  # [loss, metrics...], mean over the shards
        rec = {
            "round": self.rounds,
            "loss": float(means[0]),
            "metrics": {n: float(v) for n, v in zip(self.metric_names, means[1:])},
            "workers": [int(o[0]) for o in outs],
            "compute_s": compute,
            "comm_s": max(0.0, (t1 - t0) - compute) + (t2 - t1),
            "bytes": self.bytes_per_round,
            "interval": self.interval,
            "steps": m,
        }
        back = sorted(self.lost_workers & set(rec["workers"]))
        if back:  # a restarted worker: TensorFlow's coordinator reconnected it; it pulled x like any worker
            self.lost_workers -= set(back)
            self.rejoined_workers.extend(back)
            sys.stderr.write(
                f"tf_commopt: round {rec['round']}: worker(s) {back} are back and ran shards again\n"
            )
            sys.stderr.flush()
        idle = sorted(set(range(self.num_workers)) - set(rec["workers"]))
        if idle and self.num_shards >= self.num_workers:
            self._report_idle(idle, rec)
        self._stats["compute_s"] += rec["compute_s"]
        self._stats["comm_s"] += rec["comm_s"]
        self._stats["bytes_communicated"] += rec["bytes"]
        self.rounds += 1
        self.steps_done += m
        self.history.append(rec)
        if self._auto is not None and not self._auto.chosen and self.rounds >= self.probe_rounds:
            self._choose_interval()
        return rec

    def _choose_interval(self) -> None:
        """interval="auto": H = round(t_comm / (target_ratio x t_comp)) (tf_commopt.core.interval, thesis 001)
        from the median communication time per round and the median local-step time of the H = 1 probe
        rounds after the first (which also ships the function); then re-trace the round functions."""
        probe = self.history[1 : self.probe_rounds]
        t_comm = float(np.median([r["comm_s"] for r in probe]))
        t_comp = float(np.median([r["compute_s"] for r in probe]))
        t0 = time.perf_counter()
        h = self._auto.choose(t_comm, t_comp)
        if h != self.interval:
            self.interval = h
            self._trace(h)
        self._auto.overhead_s += time.perf_counter() - t0
        sys.stderr.write(
            f"tf_commopt: interval auto: t_comm {t_comm * 1e3:.1f} ms per round, t_comp "
            f"{t_comp * 1e3:.2f} ms per step -> H = {h} from round {self.rounds}\n"
        )
        sys.stderr.flush()

    def _cluster_spec(self) -> Dict[str, List[str]]:
        resolver = getattr(
            self.strategy, "_cluster_resolver", None
        )  # PSS.cluster_resolver is None in TF 2.21
        try:
            spec = resolver.cluster_spec()
            return {job: list(spec.job_tasks(job)) for job in spec.jobs}
        except Exception:  # pylint: disable=broad-except
            tfc = tf_config_from_env()
            return dict(tfc.cluster) if tfc else {}

    def _worker_addresses(self) -> List[str]:
        return self._cluster_spec().get("worker", [])

    def _report_idle(self, idle: List[int], rec: Dict[str, Any]) -> None:
        """A worker that ran no shard this round: say once, in one line, if it is unreachable."""
        rec["idle_workers"] = idle
        addrs = self._worker_addresses()
        for w in idle:
            if w in self.lost_workers or w >= len(addrs) or _reachable(addrs[w]):
                continue
            self.lost_workers.add(w)
            sys.stderr.write(
                f"tf_commopt: round {rec['round']}: worker {w} ({addrs[w]}) is unreachable; its "
                f"shards ran on worker(s) {sorted(set(rec['workers']))} (TensorFlow's coordinator "
                "re-ran them; the round result is unchanged)\n"
            )
            sys.stderr.flush()
        rec["lost_workers"] = sorted(self.lost_workers)

    def train(
        self, rounds: int, log: Optional[Callable[[Dict[str, Any]], None]] = None
    ) -> List[Dict[str, Any]]:
        """``rounds`` x ``run_round()``; ``log(record)`` after each."""
        out = []
        for _ in range(rounds):
            rec = self.run_round()
            if log:
                log(rec)
            out.append(rec)
        return out

    # ------------------------------------------------------------------------------------ checkpoints
    def _checkpoint(self):
        slots = {
            ("momentum" if self.rule.name == "SGD" else f"slot_{name}"): list(per_var)
            for name, per_var in zip(self.rule.slots, self._opt)
        }  # SGD: the key of earlier versions
        return tf.train.Checkpoint(variables=list(self.variables), corrections=list(self._corr), **slots)

    def save(self, directory: str, keep: int = 2) -> str:
        """Write the global model, every D_i and v_i and the round counter to ``directory/round-R`` (chief).

        Example:
            >>> path = trainer.save("/tmp/ps_backup")   # doctest: +SKIP  -> /tmp/ps_backup/round-12

        The checkpoint is written to a temporary directory and renamed, so a crash mid-write never
        leaves a half checkpoint under a ``round-R`` name; the newest ``keep`` are kept. Taken between
        rounds, it holds everything the next round reads (workers are stateless), so
        :meth:`restore_latest` on a fresh cluster continues exactly where this run stopped.
        """
        if not self._compiled:
            raise InputError("call compile() before save()", where="ParameterServerSkipCorrect")
        os.makedirs(directory, exist_ok=True)
        tmp, final = (
            os.path.join(directory, f".tmp-round-{self.rounds}"),
            os.path.join(directory, f"round-{self.rounds}"),
        )
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        self._checkpoint().write(os.path.join(tmp, "ckpt"))
        with open(os.path.join(tmp, "round.json"), "w", encoding="utf-8") as f:
            json.dump(
                {
                    "rounds": self.rounds,
                    "steps": self.steps_done,
                    "interval": self.interval,
                    "auto": self._auto is not None,
                    "correction": self.correction,
                    "optimizer": self.rule.name,
                },
                f,
            )
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in _saved_rounds(directory)[:-keep]:
            shutil.rmtree(os.path.join(directory, f"round-{old}"), ignore_errors=True)
        return final

    def restore_latest(self, directory: str) -> int:
        """Load the newest ``round-R`` checkpoint of ``directory`` (from :meth:`save`); returns R (0: none).

        Example:
            >>> start = trainer.restore_latest("/tmp/ps_backup")   # doctest: +SKIP

        One-line InputError naming the checkpoint if it is truncated, corrupt or from another model.
        """
        if not self._compiled:
            raise InputError("call compile() before restore_latest()", where="ParameterServerSkipCorrect")
        rounds = _saved_rounds(directory)
        if not rounds:
            return 0
        path = os.path.join(directory, f"round-{rounds[-1]}", "ckpt")
        try:
            with open(os.path.join(os.path.dirname(path), "round.json"), encoding="utf-8") as f:
                meta = json.load(f)
            auto = self._auto is not None
            if meta.get("optimizer", "SGD") != self.rule.name:
                raise ValueError(
                    f"saved with optimizer {meta.get('optimizer', 'SGD')}; this run has {self.rule.name}"
                )
            if (bool(meta.get("auto")), meta["correction"]) != (auto, self.correction) or (
                not auto and meta["interval"] != self.interval
            ):
                raise ValueError(
                    f"saved with interval {'auto' if meta.get('auto') else meta['interval']}, "
                    f"correction {meta['correction']}; this run has "
                    f"{'auto' if auto else self.interval}, {self.correction}"
                )
            self._checkpoint().read(path).assert_existing_objects_matched()
            done = int(meta["rounds"])
        except (tf.errors.OpError, ValueError, AssertionError, OSError, KeyError, TypeError) as e:
            first = (str(e).strip().splitlines() or [""])[0][:300]
            raise InputError(
                f"cannot restore this parameter-server checkpoint (truncated, corrupt or another "
                f"model/interval/correction?): {type(e).__name__}: {first}",
                where=path,
            ) from None
        self.rounds, self.steps_done = done, int(meta.get("steps", done * self.interval))
        if self._auto is not None and done >= self.probe_rounds:  # keep the H chosen before the save
            self._auto.interval, self._auto.chosen = int(meta["interval"]), True
            if int(meta["interval"]) != self.interval:
                self.interval = int(meta["interval"])
                self._trace(self.interval)
        return self.rounds

    def corrections(self) -> List[np.ndarray]:
        """The D_i (one [K, ...] array per variable); zeros for correction "none"."""
        if self._corr:
            return [c.numpy() for c in self._corr]
        return [
            np.zeros([self.num_shards] + v.shape.as_list(), v.dtype.as_numpy_dtype) for v in self.variables
        ]

    def stats(self) -> Dict[str, Any]:
        """``interval, steps, syncs, comm_s, compute_s, bytes_communicated`` (SkipCorrectStrategy's keys).

        compute_s: per round, the slowest closure's local-step time (measured on the worker);
        comm_s: the rest of the round (pull of x / D_i, push of s_i, scheduling, averaging on the ps);
        bytes_communicated: worker<->ps payload per round: K x 2 x model bytes for H = 1 with plain
        SGD / momentum and a constant lr, else K x (2 + [vrl or gradient] + [gradient] + 2 x optimizer
        slots) x model bytes (slots: SGD with momentum 1, Adam 2, ...). first_round_s: the first round's wall time (it also
        ships the round function, with any data constants, to the workers); median_round_s: the median
        of the later rounds.
        """
        walls = [r["compute_s"] + r["comm_s"] for r in self.history]
        auto = (
            {}
            if self._auto is None
            else {
                "interval_t_comm_s": self._auto.t_comm_s,
                "interval_t_comp_s": self._auto.t_comp_s,
                "interval_overhead_s": self._auto.overhead_s,
            }
        )
        return {
            **auto,
            "interval": self.interval,
            "steps": self.steps_done,
            "syncs": self.rounds,
            "comm_s": self._stats["comm_s"],
            "compute_s": self._stats["compute_s"],
            "bytes_communicated": self._stats["bytes_communicated"],
            "first_round_s": walls[0] if walls else None,
            "median_round_s": float(np.median(walls[1:])) if len(walls) > 1 else None,
        }
