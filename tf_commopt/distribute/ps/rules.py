"""A tf-keras optimizer as a function of tensors: the local steps of the parameter-server closures.

The parameter-server variant (``trainer.py``, ``keras_fit.py``) runs H local steps of shard i
inside one closure on a worker, on tensors (the model copy x_i and shard i's optimizer slots, pulled
from the ps), and pushes the results back into shard i's slots on the ps. A tf-keras optimizer only
updates variables, so its update is re-written here as ``(x, g, slots, lr, t) -> (x, slots)``, exactly
as tf-keras 2.21 writes it (``tf_keras/src/optimizers/{sgd,adam,rmsprop,adagrad}.py``, dense case);
``tests/tf/test_ps_fit_rules.py`` checks every rule against tf-keras's own optimizer applying the same
gradients, to 1e-6.

Notation: lr = the learning rate at the global step s (a constant, or the optimizer's
``LearningRateSchedule`` evaluated at s = ``optimizer.iterations`` before the step, as tf-keras does),
t = s + 1 (Adam's bias correction), g = the gradient the optimizer is given (on the ps path: the
shard's own mean gradient minus its correction Δ_i).

* ``SGD(momentum=μ, nesterov=n)``: μ = 0: x ← x − lr·g. μ > 0: m ← μ·m − lr·g; x ← x + m
  (Nesterov: x ← x + μ·m − lr·g, with the new m). Slot ``momentum`` (starts at 0).
* ``Adam(beta_1=β1, beta_2=β2, epsilon=ε, amsgrad=a)``: m ← m + (1 − β1)(g − m);
  v ← v + (1 − β2)(g² − v); [a: v̂ ← max(v̂, v), v := v̂];
  x ← x − α·m / (√v + ε) with α = lr·√(1 − β2^t)/(1 − β1^t). Slots ``m``, ``v`` [, ``vhat``].
* ``RMSprop(rho=ρ, momentum=μ, epsilon=ε, centered=c)``: r ← ρ·r + (1 − ρ)·g²;
  [c: a ← ρ·a + (1 − ρ)·g, d = r − a² + ε; else d = r + ε]; δ = lr·g/√d;
  μ > 0: b ← μ·b + δ, x ← x − b; else x ← x − δ. Slots ``velocity`` [, ``momentum``, ``average_gradient``].
* ``Adagrad(initial_accumulator_value=A, epsilon=ε)``: acc ← acc + g²; x ← x − lr·g/√(acc + ε).
  Slot ``accumulator`` (starts at A).

Anything else (another optimizer class, a legacy ``tf_keras.optimizers.legacy`` optimizer, weight decay,
gradient clipping, EMA, a LossScaleOptimizer) is a one-line InputError naming it and what is supported.

Example:
    >>> import tf_keras                                             # doctest: +SKIP
    >>> rule = update_rule(tf_keras.optimizers.Adam(1e-3))           # doctest: +SKIP
    >>> x, slots = rule.apply(x, g, rule.initial_slots(x), rule.lr(step), step + 1)   # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from tf_commopt import _compat
from tf_commopt.errors import InputError

__all__ = ["SUPPORTED_OPTIMIZERS", "UpdateRule", "update_rule", "sgd_rule"]

SUPPORTED_OPTIMIZERS = ("SGD", "Adam", "RMSprop", "Adagrad")
_UNSUPPORTED_OPTIONS = ("weight_decay", "clipnorm", "clipvalue", "global_clipnorm")


@dataclass(frozen=True)
class UpdateRule:
    """One optimizer's local step on tensors (see the module docstring for the exact formulas).

    Example:
        >>> rule = sgd_rule(0.1, momentum=0.9)
        >>> rule.name, rule.slots, rule.constant_lr
        ('SGD', ('momentum',), 0.1)
    """

    name: str
    hyper: Dict[str, Any]
    slots: Tuple[str, ...]
    slot_init: Tuple[float, ...]
    constant_lr: Optional[float]
    schedule: Any = field(default=None, compare=False)

    @property
    def momentum(self) -> float:
        """SGD's momentum (0 for other optimizers): the effective lr of the vrl update is lr/(1 − μ)."""
        return float(self.hyper.get("momentum", 0.0)) if self.name == "SGD" else 0.0

    @property
    def nesterov(self) -> bool:
        return bool(self.hyper.get("nesterov", False)) if self.name == "SGD" else False

    def lr(self, step: Any) -> tf.Tensor:
        """The learning rate at global step ``step`` (int tensor: the steps done before this one), float32."""
        if self.schedule is None:
            return tf.constant(self.constant_lr, tf.float32)
        return tf.cast(self.schedule(step), tf.float32)

    def lr_sum(self, step0: int, steps: int) -> float:
        """Σ lr over the global steps step0 .. step0 + steps − 1 (eager; the vrl update's k·lr)."""
        if self.schedule is None:
            return float(steps * self.constant_lr)
        return float(sum(float(self.schedule(tf.constant(s, tf.int64))) for s in range(step0, step0 + steps)))

    def initial_slots(self, x: Any) -> List[tf.Tensor]:
        """Fresh slots for a variable or tensor shaped like ``x``."""
        return [tf.fill(tf.shape(x), tf.cast(v, x.dtype)) for v in self.slot_init]

    def apply(
        self, x: tf.Tensor, g: tf.Tensor, slots: Sequence[tf.Tensor], lr: Any, t: Any
    ) -> Tuple[tf.Tensor, List[tf.Tensor]]:
        """One step of the optimizer on one variable: returns (new x, new slots in ``self.slots`` order).

        ``lr``: the learning rate of this step; ``t``: the 1-based step count (Adam's bias correction).
        """
        h, dt = self.hyper, x.dtype
        lr = tf.cast(lr, dt)
        s = list(slots)
        if self.name == "SGD":
            if not s:
                return x + (-g * lr), []
            mu = tf.cast(h["momentum"], dt)
            m = -g * lr + s[0] * mu
            return (x + (-g * lr + m * mu) if h["nesterov"] else x + m), [m]
        if self.name == "Adam":
            t = tf.cast(t, dt)
            b1, b2 = tf.cast(h["beta_1"], dt), tf.cast(h["beta_2"], dt)
            b1p, b2p = tf.pow(b1, t), tf.pow(b2, t)
            alpha = lr * tf.sqrt(1 - b2p) / (1 - b1p)
            eps = h["epsilon"] * tf.sqrt(1 - b2p) if h["adaptive_epsilon"] else tf.cast(h["epsilon"], dt)
            m = s[0] + (g - s[0]) * (1 - b1)
            v = s[1] + (tf.square(g) - s[1]) * (1 - b2)
            out = [m, v]
            if h["amsgrad"]:
                vhat = tf.maximum(s[2], v)
                out.append(vhat)
                v = vhat
            return x - (m * alpha) / (tf.sqrt(v) + eps), out
        if self.name == "RMSprop":
            rho = h["rho"]
            vel = rho * s[0] + (1 - rho) * tf.square(g)
            out = [vel]
            k = 1
            mom = None
            if h["momentum"] > 0:
                mom, k = s[k], k + 1
            if h["centered"]:
                avg = rho * s[k] + (1 - rho) * g
                denom = vel - tf.square(avg) + h["epsilon"]
            else:
                avg, denom = None, vel + h["epsilon"]
            inc = lr * g * tf.math.rsqrt(denom)
            if mom is not None:
                mom = h["momentum"] * mom + inc
                out.append(mom)
                x = x + (-mom)
            else:
                x = x + (-inc)
            if avg is not None:
                out.append(avg)
            return x, out
        if self.name == "Adagrad":
            acc = s[0] + g * g
            return x - lr * g / tf.sqrt(acc + h["epsilon"]), [acc]
        raise InputError(f"no rule for {self.name}", where="optimizer")  # unreachable: update_rule checks


def sgd_rule(learning_rate: float, momentum: float = 0.0, nesterov: bool = False) -> UpdateRule:
    """SGD with a constant lr (the rule of ``ParameterServerSkipCorrect(learning_rate=, momentum=)``).

    >>> sgd_rule(0.05).slots
    ()
    """
    slots = ("momentum",) if momentum > 0 else ()
    return UpdateRule(
        "SGD",
        {"momentum": float(momentum), "nesterov": bool(nesterov)},
        slots,
        (0.0,) * len(slots),
        float(learning_rate),
    )


def _supported_message(what: str) -> str:
    return (
        f"{what} is not supported on the parameter-server path; supported: tf_keras.optimizers."
        f"{{{', '.join(SUPPORTED_OPTIMIZERS)}}} with a constant learning rate or a LearningRateSchedule, "
        f"without {', '.join(_UNSUPPORTED_OPTIONS)}, use_ema or loss scaling"
    )


def update_rule(optimizer: Any) -> UpdateRule:
    """The :class:`UpdateRule` of a tf-keras optimizer (instance or name, e.g. ``"adam"``).

    Example:
        >>> import tf_keras                                             # doctest: +SKIP
        >>> update_rule(tf_keras.optimizers.RMSprop(0.01, centered=True)).slots   # doctest: +SKIP
        ('velocity', 'average_gradient')

    One-line InputError (naming ``optimizer``) for anything the rules above do not cover.
    """
    import tf_keras

    if isinstance(optimizer, str):
        optimizer = tf_keras.optimizers.get(optimizer)
    name = type(optimizer).__name__
    classes = {n: getattr(tf_keras.optimizers, n) for n in SUPPORTED_OPTIMIZERS}
    if type(optimizer) is not classes.get(name):
        mod = type(optimizer).__module__
        what = f"optimizer {mod}.{name}"
        if ".legacy" in mod:
            what += f" (a legacy optimizer; use tf_keras.optimizers.{name})"
        raise InputError(_supported_message(what), where="optimizer")
    cfg = optimizer.get_config()
    for opt in _UNSUPPORTED_OPTIONS:
        if cfg.get(opt):
            raise InputError(_supported_message(f"{name}({opt}={cfg[opt]!r})"), where="optimizer")
    if cfg.get("use_ema"):
        raise InputError(_supported_message(f"{name}(use_ema=True)"), where="optimizer")
    schedule = _compat.optimizer_schedule(optimizer)
    constant = None if schedule is not None else float(cfg["learning_rate"])
    if name == "SGD":
        mu = float(cfg["momentum"])
        hyper = {"momentum": mu, "nesterov": bool(cfg["nesterov"])}
        slots: Tuple[str, ...] = ("momentum",) if mu > 0 else ()
        init: Tuple[float, ...] = (0.0,) * len(slots)
    elif name == "Adam":
        hyper = {k: float(cfg[k]) for k in ("beta_1", "beta_2", "epsilon")}
        hyper.update(
            amsgrad=bool(cfg["amsgrad"]), adaptive_epsilon=bool(getattr(optimizer, "adaptive_epsilon", False))
        )
        slots = ("m", "v", "vhat") if hyper["amsgrad"] else ("m", "v")
        init = (0.0,) * len(slots)
    elif name == "RMSprop":
        hyper = {
            "rho": float(cfg["rho"]),
            "momentum": float(cfg["momentum"]),
            "epsilon": float(cfg["epsilon"]),
            "centered": bool(cfg["centered"]),
        }
        slots = (
            ("velocity",)
            + (("momentum",) if hyper["momentum"] > 0 else ())
            + (("average_gradient",) if hyper["centered"] else ())
        )
        init = (0.0,) * len(slots)
    else:  # Adagrad
        hyper = {"epsilon": float(cfg["epsilon"])}
        slots, init = ("accumulator",), (float(cfg["initial_accumulator_value"]),)
    return UpdateRule(name, hyper, slots, init, constant, schedule)
