"""The worker side of a round: one closure per shard i, run on whichever worker is free.

``closure(shard, step0, nsteps)`` (a ``tf.function`` scheduled with ``ClusterCoordinator.schedule``):

1. pull x (and D_i, shard i's optimizer slots) from the ps; G_i <- 0;
2. ``nsteps`` <= H times (a ``tf.while_loop``, so tracing does not grow with H and a shorter round
   needs no re-trace): g = grad of the loss of x_i on batch (i, step0 + j);
   (x_i, slots_i) <- U(x_i, g - D_i, slots_i, lr, t); G_i <- G_i + g;
3. write s_i = x_i - x (or g_i when the ps finishes the step), the new slots and G_i into row i of the
   ps variables (assignments: a closure re-run on another worker rewrites the same rows).

It returns (the worker's index, the local-step time measured on the worker, the mean loss and metrics
over its steps).

Example:
    >>> closure = make_closure(plan, variables, state, forward, rule, source, fixed_shard=None,
    ...                        num_metrics=0)                                  # doctest: +SKIP
    >>> coordinator.schedule(closure, args=(tf.constant(0), tf.constant(0, tf.int64), tf.constant(4)))  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import tensorflow as tf

from tf_commopt.distribute.ps.plan import RoundPlan
from tf_commopt.distribute.ps.state import ShardState

__all__ = ["make_closure"]


def _local_step(plan: RoundPlan, rule: Any, forward: Callable, batches: Callable, corr, step0) -> Callable:
    """One local step ``(j, xs, slots, gsum, loss_sum) -> (j + 1, ...)``; slots are ``[slot][variable]``.

    Without local steps (the ps finishes the step) it returns the gradients in place of ``xs``."""
    n_slots, grad_corr = plan.num_slots, plan.correction == "gradient"

    def local_step(j, xs, slots, gsum, loss_sum):
        bx, by = batches(j)
        with tf.GradientTape() as tape:
            tape.watch(xs)
            loss_v, mvals = forward(xs, bx, by)
        grads = tape.gradient(loss_v, xs)
        loss_sum = loss_sum + tf.concat([tf.cast(loss_v, tf.float64)[None], mvals], 0)
        if not plan.local:
            return j + 1, grads, slots, gsum, loss_sum
        step = step0 + tf.cast(j, tf.int64)  # the global step before this one (optimizer.iterations)
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

    return local_step


def _push(state: ShardState, shard: Any, pushed: Sequence[Any], slots, gsum: Sequence[Any]) -> List[Any]:
    """Write s_i (or g_i), the new slots and G_i into row ``shard`` of the ps variables."""

    def put(var, value):
        return var.scatter_update(tf.IndexedSlices(value[None], shard[None]))

    writes = [put(s, d) for s, d in zip(state.pushed, pushed)]
    writes += [put(o, b) for outs, news in zip(state.slots_out, slots) for o, b in zip(outs, news)]
    writes += [put(o, b) for o, b in zip(state.grad_sums, gsum)]
    return writes


def make_closure(
    plan: RoundPlan,
    variables: Sequence[Any],
    state: ShardState,
    forward: Callable,
    rule: Any,
    source: Any,
    fixed_shard: Optional[int],
    num_metrics: int,
) -> Callable:
    """The round's closure (see the module docstring).

    Args:
        plan: the kind of round (``plan.interval`` bounds the local steps).
        variables: the global model's variables (on the ps).
        state: the per-shard variables on the ps.
        forward: ``forward(params, x, y) -> (loss, metrics)`` (``forward.py``).
        rule: the optimizer's ``UpdateRule``.
        source: the data source (``data.py``).
        fixed_shard: the shard as a Python int for a per-shard source, else None (the shard argument is used).
        num_metrics: how many metric values ``forward`` returns.
    """
    local = plan.local

    @tf.function(autograph=False)  # explicit tf.while_loop
    def closure(shard, step0, nsteps):
        x0 = [tf.identity(v) for v in variables]  # pull x from the ps
        corr = state.correction_rows(shard, x0) if local else [tf.zeros_like(p) for p in x0]
        slots = state.slot_rows(shard) if local else []
        with tf.control_dependencies(x0 + corr + [s for per_var in slots for s in per_var]):
            t0 = tf.timestamp()
        batches = source.open(shard if fixed_shard is None else fixed_shard, step0)
        step = _local_step(plan, rule, forward, batches, corr, step0)
        gsum = [tf.zeros_like(p) for p in x0] if plan.correction == "gradient" else []
        loop = (
            tf.constant(0),
            [tf.identity(p) for p in x0],
            slots,
            gsum,
            tf.zeros([1 + num_metrics], tf.float64),
        )
        if local:
            _, xs, slots, gsum, loss_sum = tf.while_loop(
                lambda j, *_: j < nsteps, step, loop, maximum_iterations=plan.interval
            )
            xs, slots, gsum = list(xs), [list(s) for s in slots], list(gsum)
        else:
            _, xs, slots, gsum, loss_sum = step(*loop)
        pushed = [p - q for p, q in zip(xs, x0)] if local else xs  # s_i, or g_i (the ps finishes)
        with tf.control_dependencies(pushed + [s for per_var in slots for s in per_var] + gsum):
            t1 = tf.timestamp()
        with tf.control_dependencies(_push(state, shard, pushed, slots, gsum)):
            worker = tf.identity(tf.distribute.coordinator.experimental_get_current_worker_index())
        return worker, t1 - t0, loss_sum / tf.cast(nsteps, tf.float64)

    return closure
