"""Graph-based local search: move boundary nodes (or their in-stage closures) between adjacent stages.

Example:
    >>> from tf_commopt.core.costgraph import CostGraph, Node
    >>> from tf_commopt.core.devices import Cluster
    >>> import numpy as np

from tf_commopt.core.partition.objective import Problem
    >>> from tf_commopt.core.partition.local_search import local_search
    >>> g = CostGraph([Node(f"n{i}", t, 0) for i, t in enumerate([5, 1, 1, 1])],
    ...               [(f"n{i}", f"n{i+1}") for i in range(3)])
    >>> p = Problem(g, Cluster.homogeneous(2), 2)
    >>> local_search(p, [0, 0, 1, 1], [0, 1])[0]
    [0, 1, 1, 1]

The rule (a Kernighan-Lin-flavoured descent on the min-max objective of :mod:`objective`):

* A *move* sends a set ``M`` of nodes of stage ``s`` to ``t = s +- 1``. ``M`` is a single boundary node
  (all successors in later stages for ``t = s+1``; all predecessors in earlier stages for ``t = s-1``)
  or, when no single move helps, the *closure* of a node within ``s`` (it and its descendants in ``s``
  going up; it and its ancestors in ``s`` going down). Either keeps every edge non-decreasing, and no
  stage may become empty. Only hop ``min(s, t)`` and the compute of ``s`` and ``t`` change, so a move
  is evaluated in O(edges touching ``M`` and its predecessors).
* Each step looks at the slowest stage ``b`` and every move across its two boundaries, plus swapping
  the devices of any two stages, and applies the best one if it lowers the vector of stage times
  sorted in decreasing order (lexicographically: first the objective, then the next slowest stages).
* It stops when no move improves, or after ``max_steps``.
"""

from __future__ import annotations

import random
from typing import List, Optional, Sequence, Set, Tuple

import numpy as np

from tf_commopt.core.partition.objective import Problem

__all__ = ["State", "local_search"]


class State:
    """A convex assignment with incrementally maintained per-stage compute, hop bytes and memory."""

    def __init__(self, p: Problem, stage: Sequence[int], devs: Sequence[int]):
        self.p = p
        K, n = p.K, p.n
        st = np.asarray(stage, dtype=np.int64)
        self.stage = st.tolist()
        self.devs = list(devs)
        self.comp_rows, self.act, self.param = p.comp_lists, p.act_list, p.param_list
        self.ck = [np.bincount(st, weights=row, minlength=K).tolist() for row in p.comp]
        self.ckf = [np.bincount(st, weights=row, minlength=K).tolist() for row in p.fwd]  # forward part
        self.acts = np.bincount(st, weights=p.act, minlength=K).tolist()
        self.pars = np.bincount(st, weights=p.param, minlength=K).tolist()
        order = np.argsort(st, kind="stable")
        bounds = np.searchsorted(st[order], np.arange(K + 1))
        self.members: List[Set[int]] = [set(order[bounds[s] : bounds[s + 1]].tolist()) for s in range(K)]
        last = st.copy()
        first_succ = np.full(n, K, dtype=np.int64)  # smallest successor stage (K if none)
        last_pred = np.full(n, -1, dtype=np.int64)  # largest predecessor stage (-1 if none)
        if p.eu.size:
            np.maximum.at(last, p.eu, st[p.ev])
            np.minimum.at(first_succ, p.eu, st[p.ev])
            np.maximum.at(last_pred, p.ev, st[p.eu])
        self.last = last.tolist()
        w = np.where(last > st, p.act, 0.0)
        diff = np.bincount(st, weights=w, minlength=K + 1) - np.bincount(last, weights=w, minlength=K + 1)
        self.hop = np.maximum(np.cumsum(diff)[:K], 0.0).tolist()
        up = first_succ > st
        down = last_pred < st
        self.up_front: List[Set[int]] = [set() for _ in range(K)]
        self.down_front: List[Set[int]] = [set() for _ in range(K)]
        for v in np.nonzero(up)[0].tolist():
            self.up_front[self.stage[v]].add(v)
        for v in np.nonzero(down)[0].tolist():
            self.down_front[self.stage[v]].add(v)
        self.times = [self.stage_time(s) for s in range(K)]

    def _reflag(self, v: int) -> None:
        p, st, s = self.p, self.stage, self.stage[v]
        up = all(st[w] > s for w in p.succ[v])
        down = all(st[u] < s for u in p.pred[v])
        self.up_front[s].discard(v)
        self.down_front[s].discard(v)
        if up:
            self.up_front[s].add(v)
        if down:
            self.down_front[s].add(v)

    # ------------------------------------------------------------------ costs
    def stage_time(
        self,
        s: int,
        ck_s: Optional[float] = None,
        hop_s: Optional[float] = None,
        devs: Optional[Sequence[int]] = None,
        acts_s: Optional[float] = None,
        pars_s: Optional[float] = None,
    ) -> float:
        p, devs = self.p, devs or self.devs
        d = devs[s]
        k = p.kind_of_dev[d]
        c = (self.ck[k][s] if ck_s is None else ck_s) / p.cap[d]
        if s < p.K - 1:
            c += p.comm_ms(self.hop[s] if hop_s is None else hop_s, d, devs[s + 1])
        if p.mem_cap[d] is not None:
            mem = p.weight_versions[s] * (self.pars[s] if pars_s is None else pars_s) + (p.K - s) * (
                self.acts[s] if acts_s is None else acts_s
            )
            c += p.penalty_ms(mem, d)
        return c

    def key(self, times: Optional[Sequence[float]] = None) -> Tuple[float, ...]:
        return tuple(sorted(self.times if times is None else times, reverse=True))

    # ------------------------------------------------------------------ moves
    def movable(self, v: int, t: int) -> bool:
        s, st = self.stage[v], self.stage
        if len(self.members[s]) <= 1:
            return False
        if t == s + 1:
            return all(st[w] > s for w in self.p.succ[v])
        return all(st[u] < s for u in self.p.pred[v])

    def closure(self, v: int, t: int, limit: int) -> Optional[List[int]]:
        """``v`` with its descendants (t = s+1) or ancestors (t = s-1) inside its stage; None if too big."""
        s, st = self.stage[v], self.stage
        nbr = self.p.succ if t == s + 1 else self.p.pred
        seen, todo = {v}, [v]
        while todo:
            x = todo.pop()
            for y in nbr[x]:
                if st[y] == s and y not in seen:
                    seen.add(y)
                    if len(seen) > limit:
                        return None
                    todo.append(y)
        if len(seen) >= len(self.members[s]):
            return None
        return list(seen)

    def _delta(self, M: Sequence[int], s: int, t: int):
        """New (stage s fields, stage t fields, hop h value) if ``M`` moves s -> t."""
        p, st, Mset = self.p, self.stage, set(M)
        h = min(s, t)
        dhop = 0.0
        affected = set(M)
        for v in M:
            affected.update(p.pred[v])
        for u in affected:
            su_old = st[u]
            su_new = t if u in Mset else su_old
            last_old = self.last[u]
            last_new = su_new
            for w in p.succ[u]:
                sw = t if w in Mset else st[w]
                if sw > last_new:
                    last_new = sw
            before = su_old <= h < last_old
            after = su_new <= h < last_new
            if before != after:
                dhop += self.act[u] if after else -self.act[u]
        dck = [sum(row[v] for v in M) for row in self.comp_rows]
        dact = sum(self.act[v] for v in M)
        dpar = sum(self.param[v] for v in M)
        return dck, dact, dpar, self.hop[h] + dhop

    def delta_fwd(self, M: Sequence[int]) -> List[float]:
        """Forward ms per kind that ``M`` carries."""
        return [sum(row[v] for v in M) for row in self.p.fwd_lists]

    def try_move(self, M: Sequence[int], s: int, t: int) -> Tuple[float, float]:
        """New times of stages s and t if ``M`` moved (nothing changes)."""
        dck, dact, dpar, hop_h = self._delta(M, s, t)
        ks, kt = self.p.kind_of_dev[self.devs[s]], self.p.kind_of_dev[self.devs[t]]
        h = min(s, t)
        ts = self.stage_time(
            s,
            self.ck[ks][s] - dck[ks],
            hop_h if h == s else None,
            acts_s=self.acts[s] - dact,
            pars_s=self.pars[s] - dpar,
        )
        tt = self.stage_time(
            t,
            self.ck[kt][t] + dck[kt],
            hop_h if h == t else None,
            acts_s=self.acts[t] + dact,
            pars_s=self.pars[t] + dpar,
        )
        return ts, tt

    def apply_move(self, M: Sequence[int], s: int, t: int) -> None:
        dck, dact, dpar, hop_h = self._delta(M, s, t)
        p = self.p
        dckf = self.delta_fwd(M)
        for k in range(len(p.kinds)):
            self.ck[k][s] -= dck[k]
            self.ck[k][t] += dck[k]
            self.ckf[k][s] -= dckf[k]
            self.ckf[k][t] += dckf[k]
        self.acts[s] -= dact
        self.acts[t] += dact
        self.pars[s] -= dpar
        self.pars[t] += dpar
        self.hop[min(s, t)] = max(hop_h, 0.0)
        affected = set(M)
        for v in M:
            self.up_front[s].discard(v)
            self.down_front[s].discard(v)
            self.stage[v] = t
            self.members[s].discard(v)
            self.members[t].add(v)
        for v in M:
            affected.update(p.pred[v])
        for u in affected:
            self.last[u] = max([self.stage[u]] + [self.stage[w] for w in p.succ[u]])
        flag = set(affected)
        for v in M:
            flag.update(p.succ[v])
        for u in flag:
            self._reflag(u)
        self.times[s] = self.stage_time(s)
        self.times[t] = self.stage_time(t)

    def swap_devices(self, a: int, b: int) -> None:
        self.devs[a], self.devs[b] = self.devs[b], self.devs[a]
        self.times = [self.stage_time(s) for s in range(self.p.K)]

    @property
    def objective(self) -> float:
        return max(self.times)


def _candidates(st: State, b: int) -> List[Tuple[int, int, int]]:
    """(node, from, to) single moves across the boundaries of stage b."""
    K, out = st.p.K, []
    for s, t in ((b, b - 1), (b, b + 1), (b - 1, b), (b + 1, b)):
        if not (0 <= s < K and 0 <= t < K) or len(st.members[s]) <= 1:
            continue
        for v in st.up_front[s] if t == s + 1 else st.down_front[s]:
            out.append((v, s, t))
    return out


def improve(
    st: State,
    max_steps: int = 10_000,
    closure_limit: int = 64,
    rng: Optional[random.Random] = None,
    closure_samples: int = 24,
) -> int:
    """Run the descent on ``st`` in place; returns the number of moves applied."""
    K, steps = st.p.K, 0
    rng = rng or random.Random(0)
    while steps < max_steps:
        key0 = st.key()
        b = max(range(K), key=lambda s: st.times[s])
        best, best_key = None, key0
        for v, s, t in sorted(_candidates(st, b)):
            ts, tt = st.try_move([v], s, t)
            times = list(st.times)
            times[s], times[t] = ts, tt
            k = st.key(times)
            if k < best_key:
                best, best_key = ("move", [v], s, t), k
        if best is None and K > 1:
            for a in range(K):
                for c in range(a + 1, K):
                    st.devs[a], st.devs[c] = st.devs[c], st.devs[a]
                    k = st.key([st.stage_time(x) for x in range(K)])
                    st.devs[a], st.devs[c] = st.devs[c], st.devs[a]
                    if k < best_key:
                        best, best_key = ("swap", a, c), k
        if best is None:
            top = max(st.times)
            for s, t in ((b, b - 1), (b, b + 1), (b - 1, b), (b + 1, b)):
                if not (0 <= s < K and 0 <= t < K):
                    continue
                kt, dt = st.p.kind_of_dev[st.devs[t]], st.devs[t]
                row, cap_t = st.comp_rows[kt], st.p.cap[dt]
                pool = sorted(st.members[s])
                if len(pool) > closure_samples:
                    pool = rng.sample(pool, closure_samples)
                for v in pool:
                    M = st.closure(v, t, closure_limit)
                    if M is None or len(M) == 1:
                        continue
                    if (st.ck[kt][t] + sum(row[x] for x in M)) / cap_t >= top:
                        continue  # the receiving stage alone would be the new maximum
                    ts, tt = st.try_move(M, s, t)
                    times = list(st.times)
                    times[s], times[t] = ts, tt
                    k = st.key(times)
                    if k < best_key:
                        best, best_key = ("move", M, s, t), k
        if best is None:
            break
        if best[0] == "swap":
            st.swap_devices(best[1], best[2])
        else:
            st.apply_move(best[1], best[2], best[3])
        steps += 1
    return steps


def local_search(
    p: Problem, stage: Sequence[int], devs: Sequence[int], max_steps: int = 10_000, seed: int = 0
) -> Tuple[List[int], List[int]]:
    """Descend from a convex assignment; returns ``(stage, devs)``."""
    st = State(p, stage, devs)
    improve(st, max_steps=max_steps, rng=random.Random(seed))
    return list(st.stage), list(st.devs)
