"""Emulated slow workers for the runner (``--slow_workers=1:2.0,3:1.5``).

Worker i with factor k runs each training step's computation k times slower: the model's forward and
backward pass is wrapped in :func:`tf_commopt.tf.slowdown.slowed` (the emulation the pipeline and the
grouped hybrid use), which sleeps (k − 1)·t_min after the work, t_min the shortest forward and backward
this worker has measured. The sleep is in the traced step, after the gradients and before the optimizer's
apply, so it stretches computation only: an all-reduce in the step (SSGD every step, skip-and-correct at
a sync) is not multiplied, and the other workers, each its own process, keep working meanwhile, as
beside a slower device. The worker index is the task's position in the cluster (the chief, if any, is
0), read from TF_CONFIG through the strategy; one process without TF_CONFIG is worker 0.

The step is installed on the model instance (tf-keras calls ``model.train_step``); the model's class and
the strategy are untouched.

Example:
    >>> parse_slow_workers("1:2.0,3:1.5")
    {1: 2.0, 3: 1.5}
    >>> parse_slow_workers("1:0.5")
    Traceback (most recent call last):
    ...
    tf_commopt.errors.InputError: --slow_workers: item '1:0.5': the factor must be a finite number >= 1
"""

from __future__ import annotations

import math
from typing import Any, Dict

from tf_commopt.errors import InputError

__all__ = ["parse_slow_workers", "factor_for", "stretched_workers", "slow_train_step"]

FLAG = "--slow_workers"


def parse_slow_workers(text: str, where: str = FLAG) -> Dict[int, float]:
    """``"i:k,j:m"`` -> {i: k, j: m}: worker indices (integers >= 0, each once) and factors (>= 1).

    >>> parse_slow_workers(""), parse_slow_workers(" 0:3 ")
    ({}, {0: 3.0})
    """
    out: Dict[int, float] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        index, sep, factor = item.partition(":")
        try:
            i = int(index)
        except ValueError:
            i = -1
        if not sep or i < 0:
            raise InputError(
                f"item {item!r}: expected WORKER:FACTOR with WORKER an integer >= 0", where=where
            )
        try:
            k = float(factor)
        except ValueError:
            k = math.nan
        if not (math.isfinite(k) and k >= 1.0):
            raise InputError(f"item {item!r}: the factor must be a finite number >= 1", where=where)
        if i in out:
            raise InputError(f"item {item!r}: worker {i} is named twice", where=where)
        out[i] = k
    return out


def factor_for(slow: Dict[int, float], worker: int, workers: int, where: str = FLAG) -> float:
    """This worker's factor (1.0 when not named); InputError when ``slow`` names a worker that does not exist.

    >>> factor_for({1: 2.0}, 1, 2), factor_for({1: 2.0}, 0, 2)
    (2.0, 1.0)
    """
    missing = sorted(i for i in slow if i >= workers)
    if missing:
        raise InputError(
            f"worker {missing[0]} does not exist: the run has {workers} worker(s), numbered from 0",
            where=where,
        )
    return float(slow.get(worker, 1.0))


def stretched_workers(slowed: str, device_factor: float, workers: int) -> str:
    """The runner's ``--slow_workers`` for a setting's ``slowed`` workers on devices ``device_factor`` x slower.

    >>> stretched_workers("1:2.0", 1.0, 4), stretched_workers("1:2.0,3:2.0", 4.0, 4)
    ('1:2.0', '0:4,1:8,2:4,3:8')
    """
    if device_factor == 1.0:
        return slowed
    factors = parse_slow_workers(slowed)
    return ",".join(f"{w}:{device_factor * factors.get(w, 1.0):g}" for w in range(workers))


def slow_train_step(model: Any, factor: float) -> None:
    """Install on ``model`` a train step whose forward and backward take ``factor`` times their wall time.

    The step is tf-keras's own (unpack, forward, ``compute_loss``, gradients, ``optimizer.apply_gradients``,
    ``compute_metrics``) with the forward and backward wrapped in ``slowed``. Nothing happens for 1.
    """
    if factor == 1.0:
        return
    import tensorflow as tf
    import tf_keras

    from tf_commopt.tf.slowdown import slowed

    def forward_backward(x: Any, y: Any, sample_weight: Any = None):
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model.compute_loss(x, y, y_pred, sample_weight)
        return y_pred, loss, tape.gradient(loss, model.trainable_variables)

    stretched = slowed(forward_backward, factor)

    def train_step(data: Any) -> Any:
        x, y, sample_weight = tf_keras.utils.unpack_x_y_sample_weight(data)
        y_pred, _, grads = stretched(x, y, sample_weight)
        model.optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return model.compute_metrics(x, y, y_pred, sample_weight)

    model.train_step = train_step
