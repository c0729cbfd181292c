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

Example:
    >>> from tf_commopt.distribute.correction import validate_correction, CORRECTIONS
    >>> validate_correction("vrl"), CORRECTIONS
    ('vrl', ('vrl', 'none'))
"""
from __future__ import annotations

from typing import Any

from tf_commopt.errors import InputError

__all__ = ["CORRECTIONS", "validate_correction", "uses_delta", "vrl_delta_update"]

CORRECTIONS = ("vrl", "none")


def validate_correction(correction: object, where: str = "correction") -> str:
    """Return ``correction`` if it names a known rule, else raise a one-line InputError."""
    if not isinstance(correction, str) or correction not in CORRECTIONS:
        raise InputError(f"unknown correction {correction!r}; expected one of {', '.join(CORRECTIONS)}",
                         where=where)
    return correction


def uses_delta(correction: str) -> bool:
    """Whether the rule keeps a Δ_i term (and so needs per-replica state in checkpoints)."""
    return correction == "vrl"


def vrl_delta_update(delta: Any, x_bar: Any, x_i: Any, local_steps: Any, lr: Any) -> Any:
    """The VRL-SGD increment, Δ_i + (x̄ − x_i)/(k·lr), on tensors or numpy arrays of one replica.

    >>> import numpy as np
    >>> vrl_delta_update(np.zeros(2), np.array([1.0, 1.0]), np.array([0.0, 2.0]), 2, 0.5)
    array([ 1., -1.])
    """
    return delta + (x_bar - x_i) / (local_steps * lr)
