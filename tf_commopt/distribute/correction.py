"""Divergence-correction rules for local SGD (the "correct" in skip-and-correct).

A correction keeps, on each replica i, a per-variable term Δ_i that is subtracted from the local
gradient at every local step (replica i applies ``g_i − Δ_i``) and updated at every scheduled sync.

* ``"none"``: Δ_i ≡ 0 — plain local SGD / periodic model averaging (Lin et al., "Don't use large
  mini-batches, use local SGD", ICLR 2020; PyTorch ``PeriodicModelAverager``).
* ``"vrl"``: variance-reduced local SGD (Liang, Shen, Liu, Pan, Chen, Cheng, "Variance Reduced Local
  SGD with Lower Communication Complexity", arXiv:1912.12844, 2019; zerolxf/VRL-SGD). At a sync after
  k local steps with learning rate lr::

      Δ_i ← Δ_i + (x̄ − x_i) / (k · lr)

  where x_i is replica i's model before the sync and x̄ = mean_i x_i. Because Σ_i (x̄ − x_i) = 0,
  Σ_i Δ_i stays 0 and the update costs no extra communication (x̄ is already all-reduced).
  Intuition: (x_i − x̄)/(k·lr) is how much faster than average replica i drifted per step, i.e. the
  gap between its local gradient and the global one; subtracting it removes the between-replica
  gradient variance that makes plain local SGD drift on non-identical data.

* ``"gradient"``: the same control variate in gradient space, for every optimizer. Replica i sums
  the raw gradient estimates it saw during the period, G_i = Σ_t R·g_i^t (before the correction and
  before the optimizer); at a sync after k local steps the sums travel in the same fused all-reduce as
  the model (it doubles the bytes of a sync), Ḡ = mean_i G_i, and::

      Δ_i ← (G_i − Ḡ) / k,    G_i ← 0

  i.e. Δ_i is replica i's average gradient over the last period minus the average over all replicas.
  The local step feeds R·g_i − Δ_i to the user's optimizer (momentum, Nesterov, Adam, RMSprop, ... see
  the corrected gradient, not the raw one). Σ_i Δ_i = 0 still. For plain SGD with a constant lr during
  the period this *is* the vrl rule: x_i after k steps is x̄_0 − lr(G_i − kΔ_i), so
  (x̄ − x_i)/(k·lr) = (G_i − Ḡ)/k − Δ_i and vrl's Δ_i + (x̄ − x_i)/(k·lr) = (G_i − Ḡ)/k.
* ``"auto"`` (the default): ``"vrl"`` for plain SGD (a tf-keras ``SGD`` with momentum 0, where the two
  are equal and vrl costs no extra bytes), ``"gradient"`` for every other optimizer. Resolved per
  optimizer when its correction state is created (:func:`resolve_correction`).

Example:
    >>> from tf_commopt.distribute.correction import validate_correction, CORRECTIONS
    >>> validate_correction("vrl"), CORRECTIONS
    ('vrl', ('auto', 'gradient', 'vrl', 'none'))
"""

from __future__ import annotations

from typing import Any

from tf_commopt.errors import InputError

__all__ = [
    "CORRECTIONS",
    "CORRECTION_LRS",
    "validate_correction",
    "validate_correction_lr",
    "resolve_correction",
    "vrl_delta_update",
    "gradient_delta",
]

CORRECTIONS = ("auto", "gradient", "vrl", "none")


def validate_correction(correction: object, where: str = "correction") -> str:
    """Return ``correction`` if it names a known rule, else raise a one-line InputError."""
    if not isinstance(correction, str) or correction not in CORRECTIONS:
        raise InputError(
            f"unknown correction {correction!r}; expected one of {', '.join(CORRECTIONS)}", where=where
        )
    return correction


CORRECTION_LRS = ("optimizer", "effective")
"""The lr in the vrl update: the optimizer's own, or the effective lr/(1 − β) under heavy-ball momentum."""


def validate_correction_lr(correction_lr: object, where: str = "correction_lr") -> str:
    """Return ``correction_lr`` if it is ``"optimizer"`` or ``"effective"``, else raise a one-line InputError
    (the one check behind SkipCorrectStrategy, ParameterServerSkipCorrect and ``--correction_lr``).

    >>> validate_correction_lr("effective")
    'effective'
    """
    if not isinstance(correction_lr, str) or correction_lr not in CORRECTION_LRS:
        raise InputError(f"must be 'optimizer' or 'effective', got {correction_lr!r}", where=where)
    return correction_lr


def resolve_correction(correction: str, optimizer_class: str, momentum: float, nesterov: bool = False) -> str:
    """The rule ``correction`` means for an optimizer: ``"auto"`` is ``"vrl"`` for plain SGD and
    ``"gradient"`` otherwise; the other names mean themselves.

    >>> resolve_correction("auto", "SGD", 0.0), resolve_correction("auto", "Adam", 0.0)
    ('vrl', 'gradient')
    >>> resolve_correction("auto", "SGD", 0.9), resolve_correction("none", "Adam", 0.0)
    ('gradient', 'none')
    """
    if correction != "auto":
        return correction
    return "vrl" if optimizer_class == "SGD" and float(momentum) == 0.0 and not nesterov else "gradient"


def gradient_delta(grad_sum_i: Any, grad_sum_mean: Any, local_steps: Any) -> Any:
    """The gradient-space control variate after k local steps: (G_i − Ḡ)/k.

    >>> import numpy as np
    >>> gradient_delta(np.array([4.0, 0.0]), np.array([2.0, 2.0]), 2)
    array([ 1., -1.])
    """
    return (grad_sum_i - grad_sum_mean) / local_steps


def vrl_delta_update(delta: Any, x_bar: Any, x_i: Any, local_steps: Any, lr: Any) -> Any:
    """The VRL-SGD increment, Δ_i + (x̄ − x_i)/(k·lr), on tensors or numpy arrays of one replica.

    >>> import numpy as np
    >>> vrl_delta_update(np.zeros(2), np.array([1.0, 1.0]), np.array([0.0, 2.0]), 2, 0.5)
    array([ 1., -1.])
    """
    return delta + (x_bar - x_i) / (local_steps * lr)
