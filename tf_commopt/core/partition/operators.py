"""The genetic algorithm's graph-aware operators on convex plans (crossover and mutations).

A plan is ``(stage, devs)``: the stage of every node (nodes in topological order) and the device of
every stage. Mutations act in place on a :class:`local_search.State`, whose moves keep the plan convex.

Example:
    >>> import random
    >>> from tf_commopt.core.devices import Cluster
    >>> from tf_commopt.core.partition.objective import Problem
    >>> from tf_commopt.core.partition.local_search import State
    >>> from tf_commopt.core.partition.synthetic import branchy_graph
    >>> from tf_commopt.core.partition.operators import boundary_crossover, mutate
    >>> p = Problem(branchy_graph(30, seed=1), Cluster.homogeneous(3), 3)
    >>> a = ([3 * v // p.n for v in range(p.n)], [0, 1, 2])     # nodes are in topological order
    >>> b = ([0] * 5 + [1] * (p.n - 10) + [2] * 5, [0, 2, 1])
    >>> child, devs = boundary_crossover(p, a, b, 0)
    >>> [s for s, s_a in zip(child, a[0]) if s_a == 0] == [0] * a[0].count(0), min(child[a[0].count(0):]), devs
    (True, 1, [0, 2, 1])
    >>> st = State(p, *a)
    >>> mutate(st, random.Random(0), hetero=False)
    >>> p.check(st.stage, st.devs)      # still a convex 3-stage plan
"""

from __future__ import annotations

import random
from typing import List, Sequence, Tuple

from tf_commopt.core.partition.convexity import fill_empty
from tf_commopt.core.partition.local_search import State
from tf_commopt.core.partition.objective import Problem

__all__ = ["boundary_crossover", "mutate", "Plan"]

Plan = Tuple[List[int], List[int]]


def boundary_crossover(p: Problem, a: Plan, b: Plan, h: int) -> Plan:
    """Parent ``a``'s stages ``0..h`` and parent ``b``'s labels for the rest, lifted to at least ``h + 1``.

    Stages ``0..h`` of a convex plan are a predecessor-closed set, so the child is convex without
    repair; empty stages are refilled (:func:`convexity.fill_empty`). Devices: ``a``'s for stages
    ``<= h`` and ``b``'s after, or all of ``a``'s if that would use a device twice.
    """
    sa, da = a
    sb, db = b
    child = [x if x <= h else max(y, h + 1) for x, y in zip(sa, sb)]
    child = fill_empty(child, p.pred, p.succ, p.K)
    devs = list(da[: h + 1]) + list(db[h + 1 :])
    if len(set(devs)) != len(devs):
        devs = list(da)
    return child, devs


def _jump(st: State, rng: random.Random) -> None:
    """A random node to any stage between its predecessors' and its successors'."""
    p = st.p
    v = rng.randrange(p.n)
    lo = max((st.stage[u] for u in p.pred[v]), default=0)
    hi = min((st.stage[w] for w in p.succ[v]), default=p.K - 1)
    t = rng.randint(lo, hi)
    while st.stage[v] != t and len(st.members[st.stage[v]]) > 1:
        s = st.stage[v]
        st.apply_move([v], s, s + (1 if t > s else -1))


def _frontier(st: State, rng: random.Random) -> None:
    """1-3 boundary nodes across random stage boundaries."""
    K = st.p.K
    for _ in range(rng.randint(1, 3)):
        h = rng.randrange(K - 1)
        s, t = (h, h + 1) if rng.random() < 0.5 else (h + 1, h)
        front = st.up_front[s] if t == s + 1 else st.down_front[s]
        if len(st.members[s]) > 1 and front:
            st.apply_move([rng.choice(sorted(front))], s, t)


def _branch(st: State, rng: random.Random) -> None:
    """The closure of a random node (it and its in-stage descendants or ancestors), up to half its stage."""
    h = rng.randrange(st.p.K - 1)
    s, t = (h, h + 1) if rng.random() < 0.5 else (h + 1, h)
    if len(st.members[s]) > 1:
        v = rng.choice(sorted(st.members[s]))
        M = st.closure(v, t, limit=rng.randint(1, max(1, len(st.members[s]) // 2)))
        if M:
            st.apply_move(M, s, t)


def _swap_devices(st: State, rng: random.Random) -> None:
    """Two stages exchange devices; with spare devices, sometimes a stage moves to an unused one."""
    p = st.p
    a, b = rng.sample(range(p.K), 2)
    st.swap_devices(a, b)
    if p.D > p.K and rng.random() < 0.5:
        unused = [d for d in range(p.D) if d not in st.devs]
        st.devs[rng.randrange(p.K)] = rng.choice(unused)
        st.times = [st.stage_time(x) for x in range(p.K)]


def mutate(st: State, rng: random.Random, hetero: bool) -> None:
    """One random graph-aware mutation of ``st``, in place (the plan stays convex).

    With ``r`` uniform in [0, 1): a jump (``r < 0.25``, more than two stages), a device swap
    (``r < 0.4``, ``hetero`` clusters), 1-3 frontier moves (``r < 0.7``), else a branch move.
    """
    r = rng.random()
    if st.p.K < 2:
        return
    if r < 0.25 and st.p.K > 2:
        _jump(st, rng)
    elif hetero and r < 0.4:
        _swap_devices(st, rng)
    elif r < 0.7:
        _frontier(st, rng)
    else:
        _branch(st, rng)


def is_hetero(p: Problem) -> bool:
    """Whether device placement matters: devices of different speed or kind, or spare devices."""
    return len(set((p.cap[d], p.kind_of_dev[d]) for d in range(p.D))) > 1 or p.D > p.K


def distinct(plans: Sequence[Plan]) -> List[Plan]:
    """``plans`` without repeats (first occurrence kept), as lists."""
    seen, out = set(), []
    for s, d in plans:
        k = tuple(s) + (-1,) + tuple(d)
        if k not in seen:
            seen.add(k)
            out.append((list(s), list(d)))
    return out
