"""Skip-and-correct's sync when the workers took different numbers of local steps (pure, exact).

Worker i took τ_i local steps since the last sync, from the common model x₀, with the share p_i of the
global batch (p_i = b_i / Σ_j b_j, Σ_i p_i = 1). The sync is FedNova's normalised averaging (Wang, Liu,
Liang, Joshi, Poor, "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization", NeurIPS 2020) with skip-and-correct's corrections re-derived per step (docs/skip_correct.md,
"Workers of different speeds")::

    d_i   = (x₀ − x_i) / τ_i                   worker i's mean move per local step
    τ_eff = Σ_i p_i τ_i   ("mean", FedNova's)   or   max_i τ_i   ("max")
    x⁺    = x₀ − τ_eff · Σ_i p_i d_i           (every worker)
    vrl:       Δ_i ← Δ_i + (d_i − Σ_j p_j d_j) / clr
    gradient:  Δ_i ← G_i/τ_i − Σ_j p_j G_j/τ_j,   G_i ← 0
    none:      Δ_i unchanged (0)

clr is the lr of the vrl update (the optimizer's, or lr/(1 − β) under heavy-ball momentum); the model
update does not depend on it. τ_eff only scales the step along the normalised direction Σ p_i d_i (FedNova's
general form leaves it free; its fixed point does not depend on it): ``"mean"`` moves as far as the
workers did on average, ``"max"`` as far as the fastest worker's steps would along the averaged
direction, so a period of the fastest worker's budget makes as much progress as a period of H steps on
every worker. The corrections do not depend on τ_eff. Σ_i p_i Δ_i stays 0. With equal τ_i = k and p_i = 1/R this is today's rule:
x⁺ = mean_i x_i, vrl Δ_i + (x̄ − x_i)/(k·clr), gradient (G_i − Ḡ)/k.

Every function uses only ``+ − * /`` on its array arguments, so the same code runs on numpy arrays and on
tensors. The all-reduce form: each worker computes :func:`worker_share` (a SUM over workers gives
Σ p_i d_i, τ_eff and, for ``gradient``, Σ p_i G_i/τ_i), then :func:`from_sums`.

Example:
    >>> import numpy as np
    >>> x0 = np.array([1.0])
    >>> xs = [np.array([0.0]), np.array([0.5])]          # worker 0: 4 steps, worker 1: 2 steps
    >>> new_x, deltas = unequal_sync(x0, xs, [4, 2], "vrl", clr=0.5, deltas=[np.zeros(1), np.zeros(1)])
    >>> new_x, deltas[0], deltas[1]                       # τ_eff = 3, d = (0.25, 0.25)
    (array([0.25]), array([0.]), array([0.]))
"""

from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Tuple

from tf_commopt.errors import InputError

__all__ = [
    "RULES",
    "TAU_EFF",
    "validate_tau_eff",
    "validate_steps",
    "batch_weights",
    "effective_steps",
    "worker_share",
    "from_sums",
    "normalised_average",
    "vrl_deltas",
    "gradient_deltas",
    "unequal_sync",
]

RULES = ("vrl", "gradient", "none")
TAU_EFF = ("mean", "max")


def validate_steps(steps: Sequence[object], where: str = "steps") -> List[int]:
    """The local step counts τ_i: a non-empty sequence of integers >= 1 (one-line InputError naming the item).

    >>> validate_steps([4, 2])
    [4, 2]
    >>> validate_steps([4, 0])
    Traceback (most recent call last):
    ...
    tf_commopt.errors.InputError: steps[1]: must be an integer >= 1, got 0
    """
    if isinstance(steps, (str, bytes)) or not hasattr(steps, "__len__") or len(steps) == 0:
        raise InputError(f"must be a non-empty list of step counts, got {steps!r}", where=where)
    out = []
    for i, s in enumerate(steps):
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise InputError(f"must be an integer >= 1, got {s!r}", where=f"{where}[{i}]")
        out.append(int(s))
    return out


def batch_weights(batch_sizes: Sequence[object], where: str = "batch_sizes") -> List[float]:
    """p_i = b_i / Σ_j b_j: each worker's share of the global batch (its weight in the average).

    >>> batch_weights([32, 32, 64])
    [0.25, 0.25, 0.5]
    """
    if isinstance(batch_sizes, (str, bytes)) or not hasattr(batch_sizes, "__len__") or not batch_sizes:
        raise InputError(f"must be a non-empty list of batch sizes, got {batch_sizes!r}", where=where)
    for i, b in enumerate(batch_sizes):
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or b <= 0:
            raise InputError(f"must be a number > 0, got {b!r}", where=f"{where}[{i}]")
    total = float(sum(batch_sizes))
    return [float(b) / total for b in batch_sizes]


def _weights(weights: Optional[Sequence[float]], n: int) -> List[float]:
    if weights is None:
        return [1.0 / n] * n
    if len(weights) != n:
        raise InputError(f"{len(weights)} weights for {n} workers", where="weights")
    for i, p in enumerate(weights):
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or p < 0:
            raise InputError(f"must be a finite number >= 0, got {p!r}", where=f"weights[{i}]")
    if abs(sum(weights) - 1.0) > 1e-9:
        raise InputError(f"must sum to 1, got {sum(weights)!r}", where="weights")
    return [float(p) for p in weights]


def validate_tau_eff(tau_eff: object, where: str = "tau_eff") -> str:
    """``"mean"`` or ``"max"`` (one-line InputError otherwise).

    >>> validate_tau_eff("max")
    'max'
    """
    if tau_eff not in TAU_EFF:
        raise InputError(f"must be one of {', '.join(TAU_EFF)}, got {tau_eff!r}", where=where)
    return str(tau_eff)


def effective_steps(
    steps: Sequence[int], weights: Optional[Sequence[float]] = None, tau_eff: str = "mean"
) -> float:
    """τ_eff: Σ_i p_i τ_i (``"mean"``; p_i = 1/R when ``weights`` is None) or max_i τ_i (``"max"``).

    >>> effective_steps([4, 2]), effective_steps([4, 2], [0.75, 0.25]), effective_steps([4, 2], tau_eff="max")
    (3.0, 3.5, 4.0)
    """
    taus = validate_steps(steps)
    ps = _weights(weights, len(taus))
    if validate_tau_eff(tau_eff) == "max":
        return float(max(taus))
    return float(sum(p * t for p, t in zip(ps, taus)))


def worker_share(x0: Any, x_i: Any, tau_i: int, p_i: float, grad_sum_i: Any = None) -> Tuple[Any, float, Any]:
    """What worker i puts into the SUM all-reduce: (p_i·d_i, p_i·τ_i, p_i·G_i/τ_i or None).

    >>> import numpy as np
    >>> worker_share(np.array([1.0]), np.array([0.0]), 4, 0.5)
    (array([0.125]), 2.0, None)
    """
    d_part = (x0 - x_i) * (p_i / tau_i)
    g_part = None if grad_sum_i is None else grad_sum_i * (p_i / tau_i)
    return d_part, p_i * tau_i, g_part


def from_sums(x0: Any, d_sum: Any, tau_eff: float) -> Any:
    """x⁺ = x₀ − τ_eff · Σ_i p_i d_i, from the all-reduced sums.

    >>> import numpy as np
    >>> from_sums(np.array([1.0]), np.array([0.25]), 3.0)
    array([0.25])
    """
    return x0 - d_sum * tau_eff


def normalised_average(
    x0: Any,
    xs: Sequence[Any],
    steps: Sequence[int],
    weights: Optional[Sequence[float]] = None,
    tau_eff: str = "mean",
) -> Any:
    """FedNova's x⁺ = x₀ − τ_eff · Σ_i p_i (x₀ − x_i)/τ_i (one variable, every worker's copy in ``xs``;
    ``tau_eff`` as in :func:`effective_steps`).

    >>> import numpy as np
    >>> normalised_average(np.array([1.0]), [np.array([0.0]), np.array([0.5])], [2, 2])   # = mean
    array([0.25])
    >>> normalised_average(np.array([1.0]), [np.array([0.0]), np.array([0.5])], [4, 2], tau_eff="max")
    array([0.])
    """
    taus = validate_steps(steps)
    if len(xs) != len(taus):
        raise InputError(f"{len(xs)} models for {len(taus)} step counts", where="xs")
    ps = _weights(weights, len(taus))
    shares = [worker_share(x0, x, t, p) for x, t, p in zip(xs, taus, ps)]
    d_sum = _sum([s[0] for s in shares])
    return from_sums(x0, d_sum, effective_steps(taus, ps, tau_eff))


def _sum(parts: Sequence[Any]) -> Any:
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total


def vrl_deltas(
    deltas: Sequence[Any],
    x0: Any,
    xs: Sequence[Any],
    steps: Sequence[int],
    clr: float,
    weights: Optional[Sequence[float]] = None,
) -> List[Any]:
    """The vrl update for unequal counts: Δ_i + (d_i − Σ_j p_j d_j)/clr, d_i = (x₀ − x_i)/τ_i.

    >>> import numpy as np
    >>> [float(d[0]) for d in vrl_deltas([np.zeros(1)] * 2, np.ones(1), [np.zeros(1), np.ones(1)], [2, 4], 1.0)]
    [0.25, -0.25]
    """
    taus = validate_steps(steps)
    ps = _weights(weights, len(taus))
    ds = [(x0 - x) / t for x, t in zip(xs, taus)]
    d_bar = _sum([d * p for d, p in zip(ds, ps)])
    return [delta + (d - d_bar) / clr for delta, d in zip(deltas, ds)]


def gradient_deltas(
    grad_sums: Sequence[Any], steps: Sequence[int], weights: Optional[Sequence[float]] = None
) -> List[Any]:
    """The gradient correction for unequal counts: Δ_i = G_i/τ_i − Σ_j p_j G_j/τ_j (G_i: the period's sum).

    >>> import numpy as np
    >>> [float(d[0]) for d in gradient_deltas([np.array([4.0]), np.array([4.0])], [4, 2])]
    [-0.5, 0.5]
    """
    taus = validate_steps(steps)
    ps = _weights(weights, len(taus))
    means = [g / t for g, t in zip(grad_sums, taus)]
    g_bar = _sum([m * p for m, p in zip(means, ps)])
    return [m - g_bar for m in means]


def unequal_sync(
    x0: Any,
    xs: Sequence[Any],
    steps: Sequence[int],
    rule: str,
    clr: float = 1.0,
    deltas: Optional[Sequence[Any]] = None,
    grad_sums: Optional[Sequence[Any]] = None,
    weights: Optional[Sequence[float]] = None,
    tau_eff: str = "mean",
) -> Tuple[Any, List[Any]]:
    """One variable's sync: (x⁺, the new Δ_i of every worker) for ``rule`` in vrl, gradient, none.

    Args:
        x0: the model at the last sync (every worker's copy was x₀ then).
        xs: each worker's model now, after its τ_i local steps.
        steps: τ_i, each worker's local steps since the last sync.
        rule: the correction (``"vrl"``, ``"gradient"`` or ``"none"``).
        clr: the lr of the vrl update.
        deltas: each worker's Δ_i (zeros when None).
        grad_sums: ``gradient``: each worker's G_i (the period's raw gradient sum).
        weights: p_i (default 1/R each; :func:`batch_weights` from unequal batches).
        tau_eff: ``"mean"`` (FedNova's Σ p_i τ_i) or ``"max"`` (max_i τ_i).
    """
    if rule not in RULES:
        raise InputError(f"unknown rule {rule!r}; expected one of {', '.join(RULES)}", where="rule")
    new_x = normalised_average(x0, xs, steps, weights, tau_eff)
    deltas = list(deltas) if deltas is not None else [x0 * 0.0 for _ in xs]
    if rule == "vrl":
        if not (isinstance(clr, (int, float)) and math.isfinite(clr) and clr > 0):
            raise InputError(f"must be a finite number > 0, got {clr!r}", where="clr")
        return new_x, vrl_deltas(deltas, x0, xs, steps, clr, weights)
    if rule == "gradient":
        if grad_sums is None or len(grad_sums) != len(xs):
            raise InputError("the gradient rule needs one gradient sum per worker", where="grad_sums")
        return new_x, gradient_deltas(grad_sums, steps, weights)
    return new_x, deltas
