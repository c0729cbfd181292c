"""Baselines over one topological order: equal layer counts, balanced compute, PipeDream's DP.

Example:
    >>> from tf_commopt.core.costgraph import CostGraph, Node
    >>> from tf_commopt.core.devices import Cluster
    >>> from tf_commopt.core.partition.objective import Problem
    >>> from tf_commopt.core.partition.baselines import layerwise, balanced
    >>> g = CostGraph([Node(f"n{i}", t, 0) for i, t in enumerate([5, 1, 1, 1])],
    ...               [(f"n{i}", f"n{i+1}") for i in range(3)])
    >>> p = Problem(g, Cluster.homogeneous(2), 2)
    >>> layerwise(p, [0, 1]), balanced(p, [0, 1])
    ([0, 0, 1, 1], [0, 1, 1, 1])

All three cut one topological order ``perm`` (default: the graph's) into K contiguous chunks, stage
``s`` on device ``devs[s]``. Cutting after position ``i`` sends ``cut(i)`` bytes: the outputs of nodes in
the prefix with a consumer outside it (an antichain's activations, as in PipeDream).

* ``layerwise``: the traditional split, chunks of ``ceil``/``floor`` n/K nodes.
* ``balanced`` (torchgpipe ``balance.blockpartition`` / DeepSpeed ``partition_balanced``): minimise the
  slowest stage's *compute* ``sum fwd+bwd / capacity``, ignoring communication. Exact: bisection on the
  bottleneck value with the greedy feasibility test (each stage takes the longest prefix that fits).
* ``pipedream`` (Narayanan et al., SOSP'19, msr-fiddle/pipedream ``optimizer/optimizer_graph_hierarchical.py``,
  straight pipeline, no replication): ``A[m][j] = min_i max(A[m-1][i], T(i, j))`` with
  ``T(i, j) = max(compute(i..j)/capacity, 2*transfer(cut(i)), 2*transfer(cut(j)))`` — communication
  overlapped with compute, as PipeDream models it — plus our memory penalty. Ties between optimal
  bottlenecks can be broken by a second DP over the splits whose every stage is within the optimum
  (smallest sum of squared stage costs, or of squared compute): :func:`pipedream_ties`.
* ``contiguous_optimal``: the same DP with *our* additive stage time
  ``compute(i..j)/capacity + 2*transfer(cut(j)) + penalty``: the exact optimum of :mod:`objective`
  over contiguous splits of ``perm`` (used to seed the genetic algorithm).
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import numpy as np

from tf_commopt.core.partition.objective import Problem

__all__ = [
    "layerwise",
    "balanced",
    "pipedream",
    "pipedream_ties",
    "contiguous_optimal",
    "cut_bytes",
    "labels_from_bounds",
]


def labels_from_bounds(p: Problem, perm: Sequence[int], bounds: Sequence[int]) -> List[int]:
    """Stage labels (indexed by node) from ``bounds = [0, b1, ..., n]`` over ``perm``."""
    stage = [0] * p.n
    for s in range(len(bounds) - 1):
        for i in range(bounds[s], bounds[s + 1]):
            stage[perm[i]] = s
    return stage


def cut_bytes(p: Problem, perm: Sequence[int]) -> np.ndarray:
    """``cut[i]`` = bytes of tensors produced among ``perm[:i]`` and consumed among ``perm[i:]``."""
    pos = np.empty(p.n, dtype=np.int64)
    pos[np.asarray(perm, dtype=np.int64)] = np.arange(p.n)
    last = pos.copy()
    if p.eu.size:
        np.maximum.at(last, p.eu, pos[p.ev])
    diff = np.zeros(p.n + 2)
    np.add.at(diff, pos + 1, p.act)
    np.add.at(diff, last + 1, -p.act)
    return np.maximum(np.cumsum(diff)[: p.n + 1], 0.0)


def _prefix(p: Problem, perm: Sequence[int], values: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(values[np.asarray(perm, dtype=np.int64)])])


def layerwise(p: Problem, devs: Sequence[int], perm: Optional[Sequence[int]] = None) -> List[int]:
    """Equal layer counts (the first ``n mod K`` stages get one extra node)."""
    perm = list(range(p.n)) if perm is None else perm
    q, r = divmod(p.n, p.K)
    bounds = [0]
    for s in range(p.K):
        bounds.append(bounds[-1] + q + (1 if s < r else 0))
    return labels_from_bounds(p, perm, bounds)


def balanced(p: Problem, devs: Sequence[int], perm: Optional[Sequence[int]] = None) -> List[int]:
    """Contiguous chunks minimising the slowest stage's compute (exact up to float precision)."""
    perm = list(range(p.n)) if perm is None else perm
    return labels_from_bounds(p, perm, _balanced_bounds(p, devs, perm))


def _balanced_bounds(p: Problem, devs: Sequence[int], perm: Sequence[int]) -> List[int]:
    K, n = p.K, p.n
    pref = [_prefix(p, perm, p.comp[p.kind_of_dev[d]]) for d in devs]
    caps = [p.cap[d] for d in devs]

    def greedy(T: float) -> Optional[List[int]]:
        pos, bounds = 0, [0]
        for s in range(K - 1):
            limit = pref[s][pos] + T * caps[s] * (1 + 1e-12)
            j = int(np.searchsorted(pref[s], limit, side="right")) - 1
            j = min(j, n - (K - 1 - s))
            if j <= pos:
                if pos + 1 > n - (K - 1 - s):
                    return None
                if (pref[s][pos + 1] - pref[s][pos]) / caps[s] > T * (1 + 1e-12):
                    return None
                j = pos + 1
            bounds.append(j)
            pos = j
        if (pref[K - 1][n] - pref[K - 1][pos]) / caps[K - 1] > T * (1 + 1e-12):
            return None
        bounds.append(n)
        return bounds

    lo, hi = 0.0, max(pref[s][n] / caps[s] for s in range(K)) + 1e-9
    best = greedy(hi)
    assert best is not None
    for _ in range(100):
        if hi - lo <= 1e-12 * max(hi, 1e-300):
            break
        mid = (lo + hi) / 2
        b = greedy(mid)
        if b is None:
            lo = mid
        else:
            hi, best = mid, b
    return best


def _dp(
    p: Problem,
    devs: Sequence[int],
    perm: Sequence[int],
    stage_cost: Callable[[int, np.ndarray, np.ndarray], np.ndarray],
    compute_pref: Sequence[np.ndarray],
    bound: Optional[float] = None,
    secondary: Optional[Callable[[int, np.ndarray, np.ndarray], np.ndarray]] = None,
) -> List[int]:
    """Minimise the max stage cost over contiguous splits: ``stage_cost(m, i, j)`` is a matrix (i x j).

    ``compute_pref[m]`` are prefix sums of stage m's compute, a lower bound of its cost: starts ``i``
    whose compute alone exceeds the cost of a known split (the balanced one) are skipped (exactness kept).
    With ``bound``: among splits whose every stage costs at most ``bound``, minimise the sum over stages
    of ``secondary(m, i, j)`` instead (default: the squared stage cost), the tie-break among optimal
    bottlenecks.
    """
    K, n = p.K, p.n
    INF = float("inf")
    if bound is None:
        bb = _balanced_bounds(p, devs, perm)
        ub = max(float(stage_cost(m, np.array([bb[m]]), np.array([bb[m + 1]]))[0, 0]) for m in range(K))
        ub = ub * (1 + 1e-9) + 1e-12
    else:
        ub = bound
    A = np.full((K + 1, n + 1), INF)
    arg = np.zeros((K + 1, n + 1), dtype=np.int64)
    A[0, 0] = 0.0
    for m in range(1, K + 1):
        jlo, jhi = m, n - (K - m)  # stage m-1 ends at j, leaving >= 1 node per later stage
        js = np.arange(jlo, jhi + 1)
        ok = np.nonzero(A[m - 1, :jhi] < INF)[0] if bound is not None else np.nonzero(A[m - 1, :jhi] <= ub)[0]
        pm = compute_pref[m - 1]
        for c0 in range(0, js.size, 256):
            jj = js[c0 : c0 + 256]
            i_min = int(np.searchsorted(pm, pm[jj[0]] - ub, side="left"))
            ii = ok[(ok >= i_min) & (ok < jj[-1])]
            if ii.size == 0:
                continue
            cost = stage_cost(m - 1, ii, jj)  # (len(ii), len(jj))
            if bound is None:
                tot = np.maximum(A[m - 1, ii][:, None], cost)
            else:
                sec = cost * cost if secondary is None else secondary(m - 1, ii, jj)
                tot = A[m - 1, ii][:, None] + np.where(cost <= bound, sec, INF)
            tot[ii[:, None] >= jj[None, :]] = INF
            k = np.argmin(tot, axis=0)
            A[m, jj] = tot[k, np.arange(jj.size)]
            arg[m, jj] = ii[k]
    bounds = [n]
    for m in range(K, 0, -1):
        bounds.append(int(arg[m, bounds[-1]]))
    return labels_from_bounds(p, perm, bounds[::-1])


def _parts(p: Problem, devs: Sequence[int], perm: Sequence[int]):
    pref = [_prefix(p, perm, p.comp[p.kind_of_dev[d]]) / p.cap[d] for d in devs]
    par, act = _prefix(p, perm, p.param), _prefix(p, perm, p.act)
    cut = cut_bytes(p, perm)

    def comm(m: int, nbytes: np.ndarray) -> np.ndarray:
        if m >= p.K - 1:
            return np.zeros_like(nbytes)
        a, b = devs[m], devs[m + 1]
        return np.where(nbytes > 1e-9, 2.0 * (p.lat[a][b] + nbytes / p.bpm[a][b]), 0.0)

    def penalty(m: int, i: np.ndarray, j: np.ndarray):
        cap = p.mem_cap[devs[m]]
        if cap is None:
            return 0.0
        mem = p.weight_versions[m] * (par[j][None, :] - par[i][:, None]) + (p.K - m) * (
            act[j][None, :] - act[i][:, None]
        )
        return p.penalty_factor * np.maximum(mem - cap, 0.0) / cap

    return pref, cut, comm, penalty


def pipedream(
    p: Problem, devs: Sequence[int], perm: Optional[Sequence[int]] = None, tie_break: str = "none"
) -> List[int]:
    """PipeDream's straight-pipeline DP (communication overlapped: max, not sum).

    ``tie_break`` among the splits with the optimal bottleneck: ``"none"`` (whichever the DP's argmin
    keeps, as PipeDream's optimizer does), ``"cost2"`` (smallest sum of squared stage costs) or
    ``"compute2"`` (smallest sum of squared stage compute): the even splits a pipeline prefers, since it
    runs its non-bottleneck stages in its fill and drain. See :func:`pipedream_ties`.
    """
    if tie_break not in ("none", "cost2", "compute2"):
        raise ValueError(f"unknown tie_break {tie_break!r}")
    perm = list(range(p.n)) if perm is None else perm
    pref, cut, comm, penalty = _parts(p, devs, perm)

    def cost(m, i, j):
        compute = pref[m][j][None, :] - pref[m][i][:, None]
        t_in = comm(m - 1, cut[i]) if m > 0 else np.zeros(i.size)
        t_out = comm(m, cut[j])
        return np.maximum(np.maximum(compute, t_in[:, None]), t_out[None, :]) + penalty(m, i, j)

    stage = _dp(p, devs, perm, cost, pref)
    if tie_break == "none":
        return stage
    bounds = [0] + [i + 1 for i in range(p.n - 1) if stage[perm[i]] != stage[perm[i + 1]]] + [p.n]
    best = max(float(cost(m, np.array([bounds[m]]), np.array([bounds[m + 1]]))[0, 0]) for m in range(p.K))
    sec = None
    if tie_break == "compute2":

        def sec(m, i, j):
            c = pref[m][j][None, :] - pref[m][i][:, None]
            return c * c

    return _dp(p, devs, perm, cost, pref, bound=best * (1 + 1e-9) + 1e-12, secondary=sec)


def pipedream_ties(p: Problem, devs: Sequence[int], perm: Optional[Sequence[int]] = None) -> List[List[int]]:
    """The distinct PipeDream-optimal splits under the three tie-breaks (``none``, ``cost2``, ``compute2``);
    the caller keeps the one a pipeline runs fastest (:func:`tf_commopt.core.partition.api.partition`)."""
    out: List[List[int]] = []
    for tb in ("none", "cost2", "compute2"):
        s = pipedream(p, devs, perm, tie_break=tb)
        if s not in out:
            out.append(s)
    return out


def contiguous_optimal(p: Problem, devs: Sequence[int], perm: Optional[Sequence[int]] = None) -> List[int]:
    """The exact optimum of the additive objective over contiguous splits of ``perm``."""
    perm = list(range(p.n)) if perm is None else perm
    pref, cut, comm, penalty = _parts(p, devs, perm)

    def cost(m, i, j):
        cost = pref[m][j][None, :] - pref[m][i][:, None]
        cost += comm(m, cut[j])[None, :]
        cost += penalty(m, i, j)
        return cost

    return _dp(p, devs, perm, cost, pref)
