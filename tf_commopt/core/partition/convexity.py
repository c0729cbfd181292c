"""Convexity helpers: repair any stage labelling into a convex K-stage one; alternative topological orders.

Example:
    >>> from tf_commopt.core.partition.convexity import repair
    >>> pred = [[], [0], [1], [0]]                  # 0 -> 1 -> 2, 0 -> 3
    >>> succ = [[1, 3], [2], [], []]
    >>> repair([1, 0, 2, 0], pred, succ, 3)         # edge 0->1 went backwards; stage 0 was empty
    [0, 1, 2, 1]

Rule (nodes indexed in a topological order): a labelling is convex iff every edge ``u -> v`` has
``stage(u) <= stage(v)`` and every stage ``0..K-1`` is non-empty. :func:`repair` (1) clamps labels into
``[0, K)``, (2) raises each node to the largest stage of its predecessors in one pass over the
topological order (the least monotone labelling above the input), (3) fills each empty stage ``s``
by shifting one node per stage from the nearest stage with two or more nodes: a *sink within its
stage* (no successor in the same stage) moves one stage up, a *source within its stage* one stage down;
both moves keep every edge non-decreasing.
"""

from __future__ import annotations

import random
from typing import List, Sequence

__all__ = ["repair", "make_monotone", "fill_empty", "random_topological_order", "dfs_topological_order"]


def make_monotone(stage: Sequence[int], pred: Sequence[Sequence[int]], K: int) -> List[int]:
    """Raise each node to max(own, predecessors'); nodes must be indexed topologically."""
    out = [min(max(int(s), 0), K - 1) for s in stage]
    for v, ps in enumerate(pred):
        for p in ps:
            if out[p] > out[v]:
                out[v] = out[p]
    return out


def fill_empty(
    stage: List[int], pred: Sequence[Sequence[int]], succ: Sequence[Sequence[int]], K: int
) -> List[int]:
    """Make every stage non-empty (in place and returned) keeping convexity. Needs ``len(stage) >= K``."""
    n = len(stage)
    if n < K:
        raise ValueError(f"{K} stages for {n} nodes")
    counts = [0] * K
    for s in stage:
        counts[s] += 1
    while 0 in counts:
        e = counts.index(0)
        below = [t for t in range(e) if counts[t] >= 2]
        above = [t for t in range(e + 1, K) if counts[t] >= 2]
        if below and (not above or e - below[-1] <= above[0] - e):
            for r in range(below[-1], e):  # push one sink per stage upwards
                v = next(
                    v for v in range(n - 1, -1, -1) if stage[v] == r and all(stage[w] > r for w in succ[v])
                )
                stage[v] = r + 1
                counts[r] -= 1
                counts[r + 1] += 1
        else:
            for r in range(above[0], e, -1):  # pull one source per stage downwards
                v = next(v for v in range(n) if stage[v] == r and all(stage[p] < r for p in pred[v]))
                stage[v] = r - 1
                counts[r] -= 1
                counts[r - 1] += 1
    return stage


def repair(
    stage: Sequence[int], pred: Sequence[Sequence[int]], succ: Sequence[Sequence[int]], K: int
) -> List[int]:
    """A convex K-stage labelling close to ``stage`` (see module docstring)."""
    return fill_empty(make_monotone(stage, pred, K), pred, succ, K)


def random_topological_order(
    pred: Sequence[Sequence[int]], succ: Sequence[Sequence[int]], rng: random.Random
) -> List[int]:
    """A uniformly tie-broken topological order (Kahn's algorithm with random choice)."""
    indeg = [len(p) for p in pred]
    ready = [v for v, d in enumerate(indeg) if d == 0]
    out = []
    while ready:
        i = rng.randrange(len(ready))
        ready[i], ready[-1] = ready[-1], ready[i]
        v = ready.pop()
        out.append(v)
        for w in succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    return out


def dfs_topological_order(pred: Sequence[Sequence[int]], succ: Sequence[Sequence[int]]) -> List[int]:
    """A depth-first topological order: finishes a branch before starting its sibling (keeps branches whole)."""
    indeg = [len(p) for p in pred]
    stack = [v for v in range(len(pred) - 1, -1, -1) if indeg[v] == 0]
    out = []
    while stack:
        v = stack.pop()
        out.append(v)
        for w in reversed(succ[v]):
            indeg[w] -= 1
            if indeg[w] == 0:
                stack.append(w)
    return out
