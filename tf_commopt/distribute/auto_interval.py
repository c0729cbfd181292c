"""Baseline interval policies for SkipCorrectStrategy: AdaComm-style and grid search.

The measured rule is built into the strategy (``SkipCorrectStrategy(interval=AutoInterval(...))``). The
two baselines it is compared with need the training loss, which the strategy does not see, so they are a
Keras callback and a function over trial runs; both drive the strategy through ``set_interval``.

Example:
    >>> strategy = SkipCorrectStrategy(interval=4)                           # doctest: +SKIP
    >>> cb = AdaCommCallback(strategy, initial_interval=4, max_interval=16)  # doctest: +SKIP
    >>> model.fit(ds, callbacks=[cb]); cb.policy.overhead_s                  # doctest: +SKIP
    >>> h, policy = keras_grid_search(model, strategy, ds, steps_per_trial=10)  # doctest: +SKIP

* :class:`AdaCommCallback` — Wang & Joshi, "Adaptive Communication Strategies to Achieve the Best
  Error-Runtime Trade-off in Local-Update SGD" (SysML 2019), as PaddlePaddle's
  ``AdaptiveLocalSGDOptimizer`` implements it: after every sync the workers all-reduce their training
  loss (one extra collective per sync, its wall time is the overhead) and set
  H = clip(ceil(sqrt(lr_0·loss/(lr·loss_0)·H_0)), 1, max) (:class:`tf_commopt.core.interval.AdaCommPolicy`).
  The loss is the Keras running mean of the epoch's batch losses on this worker.
* :func:`keras_grid_search` — a short trial of ``steps_per_trial`` steps for each H in
  {1, 2, 4, ..., 64}, each from the same starting weights (restored after every trial; the optimizer
  slots and the correction state carry over); the H with the largest loss decrease per wall second
  wins (:class:`tf_commopt.core.interval.GridSearchPolicy`). The overhead is all trials' wall time.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Sequence, Tuple, Union

import tensorflow as tf

from tf_commopt._compat import optimizer_lr
from tf_commopt._keras_callback import Callback
from tf_commopt.core.interval import AdaCommPolicy, GridSearchPolicy, TrialResult
from tf_commopt.errors import InputError

__all__ = ["allreduce_mean", "AdaCommCallback", "keras_grid_search"]

_REDUCERS: Dict[int, Any] = {}


def allreduce_mean(strategy: tf.distribute.Strategy, values: Sequence[float]) -> List[float]:
    """Mean of ``values`` over all replicas (every worker must call it together).

    >>> allreduce_mean(strategy, [2.0])   # doctest: +SKIP
    [2.0]
    """
    fn = _REDUCERS.get(id(strategy))
    if fn is None:

        @tf.function
        def fn(v):
            def replica(x):
                return tf.distribute.get_replica_context().all_reduce(
                    tf.distribute.ReduceOp.MEAN, tf.identity(x)
                )

            return strategy.run(replica, args=(v,))

        _REDUCERS[id(strategy)] = fn
    out = strategy.experimental_local_results(fn(tf.constant(list(values), tf.float64)))[0]
    return [float(x) for x in out.numpy()]


def _lr(model: Any) -> float:
    return float(optimizer_lr(model.optimizer).numpy())


class AdaCommCallback(Callback):
    """AdaComm-style interval: after each sync, all-reduce the loss and re-estimate H (see module doc)."""

    def __init__(self, strategy: Any, initial_interval: int = 4, max_interval: int = 16):
        super().__init__()
        if not hasattr(strategy, "set_interval"):
            raise InputError(
                "AdaCommCallback needs a SkipCorrectStrategy", where="AdaCommCallback(strategy=...)"
            )
        self.strategy = strategy
        self.policy = AdaCommPolicy(initial_interval=initial_interval, max_interval=max_interval)
        self._syncs = None
        strategy.set_interval(initial_interval)

    def on_train_begin(self, logs: Any = None) -> None:
        self._syncs = self.strategy.stats()["syncs"]  # a call may end at a sync (the graph loop)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        syncs = self.strategy.stats()["syncs"]
        if self._syncs is None or syncs != self._syncs:
            if self._syncs is not None and logs and "loss" in logs:
                t0 = time.perf_counter()
                (loss,) = allreduce_mean(self.strategy, [float(logs["loss"])])
                h = self.policy.on_sync(loss, _lr(self.model), overhead_s=0.0)
                self.strategy.set_interval(h)
                self.policy.overhead_s += time.perf_counter() - t0
            self._syncs = syncs


def keras_grid_search(
    model: Any,
    strategy: Any,
    dataset: Any,
    steps_per_trial: Union[int, Callable[[int], int]] = 10,
    candidates: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
) -> Tuple[int, GridSearchPolicy]:
    """Grid search over H with short ``model.fit`` trials from the same weights; sets and returns H.

    ``dataset`` is a (distributed) dataset or iterator ``model.fit`` accepts and that repeats. Every
    worker must call this together (the trials synchronise). ``steps_per_trial`` may depend on H
    (e.g. ``lambda h: max(8, 2 * h)`` so that every trial contains at least two syncs).
    """
    policy = GridSearchPolicy(candidates=tuple(candidates))
    start = model.get_weights()

    class _Losses(Callback):
        def __init__(self):
            super().__init__()
            self.means: List[float] = []

        def on_train_batch_end(self, batch, logs=None):
            self.means.append(float(logs["loss"]))

    def trial(h: int) -> TrialResult:
        strategy.set_interval(h)
        rec = _Losses()
        t0 = time.perf_counter()
        n = steps_per_trial(h) if callable(steps_per_trial) else steps_per_trial
        model.fit(dataset, epochs=1, steps_per_epoch=n, verbose=0, callbacks=[rec])
        strategy.sync()
        wall = time.perf_counter() - t0
        m = rec.means
        # per-batch losses from the running means: l_b = (b+1) m_b - b m_{b-1}
        per = [m[0]] + [(b + 1) * m[b] - b * m[b - 1] for b in range(1, len(m))]
        tail = per[-max(1, len(per) // 4) :]
        losses = allreduce_mean(strategy, [per[0], sum(tail) / len(tail)])
        model.set_weights(start)
        return TrialResult(h, losses[0], losses[1], wall)

    h = policy.run(trial)
    strategy.set_interval(h)
    return h, policy
