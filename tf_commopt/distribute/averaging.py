"""How a SkipCorrectStrategy averages: the fused all-reduce, the model average with the correction update,
and the agreement on a few floats. The *when* is the interval policy's (``interval_state.py``), the
overlapped variant is ``overlap.py``.

Every function takes the strategy's StrategyExtended (cross-replica context) and works on per-replica
components: ``per_var[j][i]`` is variable (or tensor) j on local replica i.

The sync rule (docs/skip_correct.md): x̄ = mean_i x_i in one fused all-reduce per dtype; for ``vrl``
Δ_i ← Δ_i + (x̄ − x_i)/(k·lr); for ``gradient`` (the period's raw gradient sums G_i travel in the same
all-reduce) Δ_i ← (G_i − Ḡ)/k, G_i ← 0; then x_i ← x̄.

Example:
    >>> means = fused_reduce(ext, tf.distribute.ReduceOp.MEAN, [[a0, a1], [b0, b1]])   # doctest: +SKIP
    >>> seconds = average(ext, variables, state=state, n_trainable=2, local_steps=k, lr=lr)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import tensorflow as tf

from tf_commopt._compat import values as _values
from tf_commopt.distribute import correction as _corr
from tf_commopt.distribute.state import SkipCorrectState

__all__ = ["components", "regroup", "fused_reduce", "average", "agree"]

# explicit tf.cond graphs: autograph converting them (they are reached from the converted train_step)
# would only cost tracing time
_no_autograph = tf.autograph.experimental.do_not_convert


def components(value: Any) -> List[Any]:
    """The per-replica components of a distributed value (``[value]`` for a plain tensor)."""
    if isinstance(value, _values.DistributedValues):
        return list(value.values)
    return [value]


def regroup(comps: Sequence[Any]) -> Any:
    """One tensor per local replica -> a ``PerReplica`` value."""
    return _values.PerReplica(tuple(comps))


@_no_autograph
def fused_reduce(
    ext: Any, op: Any, per_var: List[List[tf.Tensor]], reduce_to: Optional[Any] = None
) -> List[List[tf.Tensor]]:
    """All-reduce many tensors as one flat buffer per dtype (the strategy's one communication path).

    Args:
        ext: the strategy's StrategyExtended (its ``reduce_to``, ``worker_devices``, ``telemetry``).
        op: ``tf.distribute.ReduceOp.SUM`` or ``MEAN``.
        per_var: ``per_var[j][i]`` = tensor j on local replica i.
        reduce_to: ``reduce_to(op, value, destinations)`` in place of ``ext.reduce_to`` (the overlapped
            averaging's own collective group).

    Returns:
        The reduced tensors in the same layout. The payload's bytes are added to ``ext.telemetry``.
    """
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
            with tf.device(per_var[idx[0]][i].device or ext.worker_devices[i]):
                bufs.append(tf.concat([tf.reshape(per_var[j][i], [-1]) for j in idx], axis=0))
        value = regroup(bufs)
        reduced = components((reduce_to or ext.reduce_to)(op, value, destinations=value))
        for i in range(n_local):
            with tf.device(bufs[i].device):
                pieces = tf.split(reduced[i], sizes) if len(sizes) > 1 else [reduced[i]]
                for j, piece in zip(idx, pieces):
                    out[j][i] = tf.reshape(piece, tf.shape(per_var[j][i]))
    ext.telemetry.bytes.assign_add(payload)
    return out  # type: ignore[return-value]


def _new_delta(
    rule: str, d: Any, mean: Any, own: Any, local_steps: Any, lr: Any, sum_pair: Optional[tuple]
) -> Any:
    """Δ_i after a sync: vrl Δ_i + (x̄ − x_i)/(k·lr); gradient (G_i − Ḡ)/k (``sum_pair`` = (G_i, Ḡ))."""
    if rule == "vrl":
        scale = tf.cast(local_steps, d.dtype) * tf.cast(lr, d.dtype)
        return _corr.vrl_delta_update(
            d.read_value(), tf.cast(mean, d.dtype), tf.cast(own, d.dtype), 1.0, scale
        )
    g_i, g_bar = sum_pair
    return _corr.gradient_delta(g_i, g_bar, tf.cast(local_steps, d.dtype))


@_no_autograph
def average(
    ext: Any,
    variables: Sequence[Any],
    state: Optional[SkipCorrectState] = None,
    n_trainable: int = 0,
    local_steps: Any = None,
    lr: Any = None,
) -> tf.Tensor:
    """x̄ = mean_i x_i in one fused all-reduce; the Δ update of the first ``n_trainable``; x_i ← x̄.

    Args:
        ext: the strategy's StrategyExtended.
        variables: mirrored variables to average (the correction state's trainable ones first).
        state: the correction state (its rule, Δ_i and G_i), or None for a plain average.
        n_trainable: how many of ``variables`` have a Δ.
        local_steps: k, the local steps since the last scheduled sync (a scalar tensor).
        lr: the learning rate of the vrl update.

    Returns:
        The seconds the averaging took (float64), also added to ``ext.telemetry``.
    """
    if not variables:
        return tf.constant(0.0, tf.float64)
    t0 = tf.timestamp()
    rule = state.rule if state is not None else "none"
    sums = state.grad_sum_components() if rule == "gradient" else None
    with tf.control_dependencies([t0]):
        comps = [[c.read_value() for c in v.values] for v in variables]
        if sums is not None:  # G_i travel in the same fused all-reduce as the model
            comps += [[c.read_value() for c in row] for row in sums]
    means = fused_reduce(ext, tf.distribute.ReduceOp.MEAN, comps)
    deltas = state.delta_components() if state is not None else None
    n = len(variables)
    ops = []
    for j, v in enumerate(variables):
        for i, c in enumerate(v.values):
            with tf.device(c.device):
                if deltas is not None and j < n_trainable:
                    d = deltas[j][i]
                    pair = (comps[n + j][i], means[n + j][i]) if sums is not None else None
                    new_d = _new_delta(rule, d, means[j][i], comps[j][i], local_steps, lr, pair)
                    if sums is not None:
                        ops.append(sums[j][i].assign(tf.zeros_like(comps[n + j][i])))
                    ops.append(d.assign(tf.cast(new_d, d.dtype)))
                ops.append(c.assign(means[j][i]))
    with tf.control_dependencies(ops):
        t1 = tf.timestamp()
    ext.telemetry.add_sync(t1 - t0)
    return t1 - t0


@_no_autograph
def agree(ext: Any, vec: tf.Tensor) -> tf.Tensor:
    """MEAN of a small float vector over all replicas (every worker calls it at the same step)."""
    comps = []
    for d in ext.worker_devices:
        with tf.device(d):
            comps.append(tf.identity(vec))
    value = regroup(comps)
    return components(ext.reduce_to(tf.distribute.ReduceOp.MEAN, value, destinations=value))[0]
