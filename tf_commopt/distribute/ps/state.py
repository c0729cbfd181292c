"""What lives on the ps besides the global model: one ``[K, ...]`` variable per model variable and role.

Roles (K = shards; each closure reads and writes row i only, by assignment):

* ``pushed``: s_i = x_i - x (or, when the ps finishes the step, the gradient g_i), written by closure i;
* ``corrections``: D_i (``vrl`` and ``gradient`` only), written by the averaging step;
* ``grad_sums``: G_i, the round's raw gradient sum (``gradient`` only), written by closure i;
* ``slots``: the optimizer slots of each shard, ``[slot][variable]`` (SGD with momentum: v_i; Adam: m_i,
  v_i; ...), read by the closures;
* ``slots_out``: where the closures write their new slots (the averaging step copies them into
  ``slots``): a closure re-run after a worker died half-way through its writes reads unchanged slots,
  so every closure is idempotent.

Example:
    >>> state = build_state(strategy, variables, rule, "vrl", num_shards=2, local_slots=True)  # doctest: +SKIP
    >>> [c.shape for c in state.corrections]                                                  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Sequence

import tensorflow as tf

__all__ = ["ShardState", "build_state", "checkpoint"]


@dataclass
class ShardState:
    """The per-shard variables on the ps (see the module docstring for each role)."""

    pushed: List[tf.Variable]
    corrections: List[tf.Variable]
    grad_sums: List[tf.Variable]
    slots: List[List[tf.Variable]]
    slots_out: List[List[tf.Variable]]
    param_bytes: int

    def correction_rows(self, shard: Any, like: Sequence[Any]) -> List[tf.Tensor]:
        """D_i of ``shard`` per variable (zeros like ``like`` without a correction), read inside a closure."""
        if self.corrections:
            return [tf.gather(c, shard) for c in self.corrections]
        return [tf.zeros_like(p) for p in like]

    def slot_rows(self, shard: Any) -> List[List[tf.Tensor]]:
        """The optimizer slots of ``shard``, ``[slot][variable]``, read inside a closure."""
        return [[tf.gather(s, shard) for s in per_var] for per_var in self.slots]


def _per_shard(v: Any, k: int, name: str, init: float = 0.0) -> tf.Variable:
    with tf.device(v.device):
        return tf.Variable(
            tf.fill([k] + v.shape.as_list(), tf.cast(init, v.dtype)),
            trainable=False,
            name=f"{name}_{v.name.split(':')[0].replace('/', '_')}",
        )


def build_state(
    strategy: tf.distribute.Strategy,
    variables: Sequence[Any],
    rule: Any,
    correction: str,
    num_shards: int,
    local_slots: bool,
) -> ShardState:
    """Create the per-shard variables of ``variables`` on the ps tasks (under ``strategy``'s scope).

    Args:
        strategy: the ParameterServerStrategy holding ``variables``.
        variables: the model's trainable variables.
        rule: the optimizer's ``UpdateRule`` (its slots and their initial values).
        correction: ``"vrl"``, ``"gradient"`` or ``"none"`` (resolved).
        num_shards: K.
        local_slots: whether closures write new optimizer slots (``slots_out``); False only when every
            round is a step the ps finishes itself.
    """
    k = num_shards
    corr = correction in ("vrl", "gradient")
    with strategy.scope():
        return ShardState(
            pushed=[_per_shard(v, k, "delta_slot") for v in variables],
            corrections=[_per_shard(v, k, "correction") for v in variables] if corr else [],
            grad_sums=[_per_shard(v, k, "grad_sum") for v in variables] if correction == "gradient" else [],
            slots=[
                [_per_shard(v, k, name, init) for v in variables]
                for name, init in zip(rule.slots, rule.slot_init)
            ],
            slots_out=(
                [[_per_shard(v, k, name + "_out") for v in variables] for name in rule.slots]
                if rule.slots and local_slots
                else []
            ),
            param_bytes=int(sum(v.shape.num_elements() * v.dtype.size for v in variables)),
        )


def checkpoint(variables: Sequence[Any], state: ShardState, rule: Any) -> tf.train.Checkpoint:
    """A ``tf.train.Checkpoint`` of the global model, every D_i and the per-shard optimizer slots.

    SGD's one slot is saved as ``momentum``, every other optimizer's as ``slot_<name>``.
    """
    slots = {
        ("momentum" if rule.name == "SGD" else f"slot_{name}"): list(per_var)
        for name, per_var in zip(rule.slots, state.slots)
    }
    return tf.train.Checkpoint(variables=list(variables), corrections=list(state.corrections), **slots)
