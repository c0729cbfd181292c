"""The ps side of a round: after the K closures, one function that runs on the ps tasks.

For each model variable x (on the ps that holds it), with s_i the rows the closures pushed:

* local rounds: the closures' new slots become the next round's; x <- x + mean_i s_i (= mean_i x_i);
* the ps finishes the step (rows hold g_i): s_i = -lr (g_i - D_i), or with momentum
  v_i <- mu v_i - lr (g_i - D_i), s_i = v_i; then x <- x + mean_i s_i;
* synchronous rounds (rows hold g_i): x <- U(x, mean_i g_i, slots, lr_s0, s0 + 1), the new slots written
  to every shard's row;

then the correction: ``vrl``: D_i <- D_i + (mean_j s_j - s_i) / (sum of lr' over the round)
(``correction.vrl_delta_update``; lr' = lr x ``eff``, eff = 1 / (1 - mu) for ``correction_lr="effective"``);
``gradient``: D_i <- (G_i - mean_j G_j) / m (``correction.gradient_delta``). Both keep sum_i D_i = 0.

Example:
    >>> apply = make_apply(plan, variables, state, rule, eff=1.0)        # doctest: +SKIP
    >>> apply(tf.constant(4), tf.constant(0.4), tf.constant(0, tf.int64))  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from tf_commopt.distribute.correction import gradient_delta, vrl_delta_update
from tf_commopt.distribute.ps.plan import RoundPlan
from tf_commopt.distribute.ps.state import ShardState

__all__ = ["make_apply"]


def _synchronous(idx: int, v: Any, state: ShardState, rule: Any, step0: Any) -> None:
    """x <- U(x, mean_i g_i, slots, lr_s0, s0 + 1) on the ps; the new slots go to every shard's row."""
    x_new, new = rule.apply(
        v.read_value(),
        tf.reduce_mean(state.pushed[idx].read_value(), axis=0),
        [per_var[idx][0] for per_var in state.slots],
        rule.lr(step0),
        step0 + 1,
    )
    for per_var, value in zip(state.slots, new):
        per_var[idx].assign(tf.broadcast_to(value[None], tf.shape(per_var[idx])))
    v.assign(x_new)


def _finish_sgd_step(idx: int, sv: Any, state: ShardState, rule: Any) -> Any:
    """The rows hold g_i: the SGD (momentum) step of every shard, s_i = x_i - x."""
    step = sv - state.corrections[idx].read_value() if state.corrections else sv
    lr = rule.constant_lr
    if rule.slots:  # SGD's v_i
        mom = state.slots[0][idx]
        mom.assign(rule.momentum * mom - lr * step)
        return mom.read_value()
    return -lr * step


def _correct(
    idx: int, v: Any, mean: Any, sv: Any, state: ShardState, plan: RoundPlan, m: Any, lr: Any
) -> None:
    """The correction's update after the averaging (``lr``: the mean lr' of the round's steps)."""
    if (
        plan.correction == "vrl"
    ):  # D_i += (x_bar - x_i) / (sum of lr' over the round), x_bar - x_i = mean - s_i
        c = state.corrections[idx]
        c.assign(vrl_delta_update(c.read_value(), mean[None], sv, tf.cast(m, v.dtype), tf.cast(lr, v.dtype)))
    elif plan.correction == "gradient":  # D_i = (G_i - mean_j G_j) / m  (sum_i D_i = 0)
        gs = state.grad_sums[idx].read_value()
        state.corrections[idx].assign(
            gradient_delta(gs, tf.reduce_mean(gs, axis=0)[None], tf.cast(m, v.dtype))
        )


def make_apply(
    plan: RoundPlan, variables: Sequence[Any], state: ShardState, rule: Any, eff: float
) -> Callable:
    """``apply(nsteps, lr_sum, step0)``: the averaging of a round of ``nsteps`` local steps from global step
    ``step0`` (``lr_sum``: the sum of the optimizer's lr over those steps), run on the ps.

    Args:
        plan: the kind of round.
        variables: the global model's variables.
        state: the per-shard variables on the ps.
        rule: the optimizer's ``UpdateRule``.
        eff: lr' / lr in the vrl update (1 / (1 - mu) or 1).
    """

    @tf.function(autograph=False)
    def apply(nsteps, lr_sum, step0):
        m = tf.cast(nsteps, tf.float32)
        for idx, v in enumerate(variables):
            with tf.device(v.device):  # on the ps that holds v
                if plan.synchronous:
                    _synchronous(idx, v, state, rule, step0)
                    continue
                sv = state.pushed[idx].read_value()
                if plan.local:
                    for outs, ins in zip(
                        state.slots_out, state.slots
                    ):  # the closures' slots become the next round's
                        ins[idx].assign(outs[idx].read_value())
                else:
                    sv = _finish_sgd_step(idx, sv, state, rule)
                mean = tf.reduce_mean(sv, axis=0)
                v.assign_add(mean)
                _correct(idx, v, mean, sv, state, plan, m, lr_sum * eff / m)
        return tf.constant(0)

    return apply
