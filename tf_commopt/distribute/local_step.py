"""The gradients of one SkipCorrectStrategy step: R·g_i − Δ_i per replica (local phase) or the SUM
all-reduce (warm-up). The sync after the step is ``averaging.py``'s; when it happens, ``interval_state.py``'s.

Replica i's loss is scaled by 1/global batch (tf.distribute's convention), so the SUM over replicas is the
global gradient and R·g_i is replica i's own estimate of it. For ``correction="gradient"`` the raw
estimates are summed over the period (G_i ← G_i + R·g_i) before Δ_i is subtracted.

Example:
    >>> grads = local_gradients(ext, state, optimizer, var_list, grads, warmup_steps=0)   # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import tensorflow as tf

from tf_commopt._compat import container_strategy
from tf_commopt.distribute.averaging import components, fused_reduce, regroup
from tf_commopt.distribute.state import SkipCorrectState

__all__ = ["local_gradients", "no_aggregation"]

_no_autograph = tf.autograph.experimental.do_not_convert


def no_aggregation(legacy: bool) -> Dict[str, bool]:
    """The ``apply_gradients`` keyword that turns tf-keras's gradient all-reduce off (legacy or current)."""
    return {"experimental_aggregate_gradients": False} if legacy else {"skip_gradients_aggregation": True}


def _rows(
    per_replica: Optional[List[List[Any]]], state: SkipCorrectState, var_list: Sequence[Any]
) -> Optional[List[List[Any]]]:
    """The rows of ``per_replica`` (one per state variable) in the order of ``var_list``."""
    if per_replica is None:
        return None
    index = {id(v): j for j, v in enumerate(state.variables)}
    return [per_replica[index[id(v)]] for v in var_list]


@_no_autograph
def _corrected(
    ext: Any, per_var: List[List[Any]], deltas: Optional[List[List[Any]]], sums: Optional[List[List[Any]]]
) -> List[List[Any]]:
    """R·g_i − Δ_i for every variable j and local replica i (G_i += R·g_i first, for "gradient")."""
    r = float(container_strategy(ext).num_replicas_in_sync)
    out = []
    for j, comps in enumerate(per_var):
        row = []
        for i, g in enumerate(comps):
            with tf.device(getattr(g, "device", None) or ext.worker_devices[i]):
                g = tf.convert_to_tensor(g) * tf.cast(r, g.dtype)
                if sums is not None:
                    acc = sums[j][i].assign_add(tf.cast(g, sums[j][i].dtype))
                    with tf.control_dependencies([acc]):
                        g = tf.identity(g)
                if deltas is not None:
                    g = g - tf.cast(deltas[j][i].read_value(), g.dtype)
            row.append(g)
        out.append(row)
    return out


@_no_autograph
def local_gradients(
    ext: Any,
    state: SkipCorrectState,
    optimizer: Any,
    var_list: Sequence[Any],
    grads: Sequence[Any],
    warmup_steps: int,
) -> List[Any]:
    """Cross-replica: the gradients to apply this step, one ``PerReplica`` per variable.

    Args:
        ext: the strategy's StrategyExtended.
        state: the optimizer's correction state (Δ_i, G_i).
        optimizer: the tf-keras optimizer (its ``iterations`` is t − 1 before the step).
        var_list: the variables that got a gradient.
        grads: their per-replica gradients g_i.
        warmup_steps: t ≤ warmup_steps is synchronous SGD (SUM all-reduce), later steps are local.
    """
    per_var = [components(g) for g in grads]
    n_local = len(per_var[0])
    deltas = _rows(state.delta_components(), state, var_list)
    sums = _rows(state.grad_sum_components(), state, var_list)
    if warmup_steps <= 0:
        return [regroup(row) for row in _corrected(ext, per_var, deltas, sums)]
    warm = tf.cast(optimizer.iterations, tf.int64) + 1 <= warmup_steps

    def ssgd() -> List[Any]:
        dense = [[tf.convert_to_tensor(g) for g in comps] for comps in per_var]
        return [x for row in fused_reduce(ext, tf.distribute.ReduceOp.SUM, dense) for x in row]

    def local() -> List[Any]:
        return [x for row in _corrected(ext, per_var, deltas, sums) for x in row]

    flat = tf.cond(warm, ssgd, local)
    return [regroup(flat[j * n_local : (j + 1) * n_local]) for j in range(len(per_var))]
