"""Search on the pipeline time: a memetic local search and a graph-aware genetic algorithm.

Both minimise :class:`pipemodel.PipelineModel` (the GPipe iteration, exact for the simulator, or the
1F1B period), tie-broken by the bytes crossing stage boundaries. Plans are ``(stage, devs)`` pairs:
stage of every node (nodes in topological order) and device of every stage.

Example:
    >>> from tf_commopt.core.partition.synthetic import branchy_graph
    >>> from tf_commopt.core.devices import Cluster
    >>> from tf_commopt.core.partition.objective import Problem
    >>> from tf_commopt.core.partition.pipemodel import PipelineModel
    >>> from tf_commopt.core.partition.baselines import balanced
    >>> from tf_commopt.core.partition.pipesearch import pipe_local_search
    >>> p = Problem(branchy_graph(120, seed=3), Cluster.homogeneous(4, bandwidth_gbps=10), 4)
    >>> model = PipelineModel(p, "gpipe", 16)
    >>> start = (balanced(p, [0, 1, 2, 3]), [0, 1, 2, 3])
    >>> stage, devs = pipe_local_search(p, model, *start)
    >>> model.time(stage, devs) <= model.time(*start)
    True

**Local search** (:func:`pipe_improve`): best-improvement descent. A move sends a boundary node (all
its successors in later stages, or all its predecessors in earlier ones) to the adjacent stage, over
*every* boundary (the pipeline time has sums, not only a maximum, so any hop matters); when no single
move helps, on heterogeneous clusters every swap of two stages' devices, then the closure of a sampled
node (a whole branch: it and its in-stage descendants going up, ancestors going down) out of the
slowest stage or across the slowest hop. A move is evaluated in O(edges touching it + K) from incrementally kept per-stage
forward/backward compute and hop bytes (:class:`local_search.State`).

**Genetic algorithm** (:func:`pipe_genetic`), thesis 000's method with operators that know the graph:

* *boundary crossover*: pick a stage boundary ``h``; the child takes parent A's stages ``0..h``
  (a predecessor-closed set, since A is convex) and parent B's labels for the rest, lifted to at
  least ``h + 1``; convex by construction (no repair needed), empty stages refilled
  (:func:`convexity.fill_empty`); devices from A for stages ``<= h`` and B after, if distinct;
* *mutations*: a jump (a random node to any stage between its predecessors' and its successors'),
  1-3 frontier moves across random boundaries, a branch move (the closure of a random node, up to
  half its stage), or a device swap (heterogeneous clusters);
* *memetic step*: every child is improved by :func:`pipe_improve` (a few steps, moves focused on the
  stages next to the slowest stage and the slowest hop);
* *selection*: tournaments of 3; the next population is the best ``pop_size`` distinct plans of
  parents and children (elitist: never worse than its best seed). Stops after ``generations`` or
  ``stall`` generations without improvement. Deterministic for a seed (``random.Random(seed)``).
"""

from __future__ import annotations

import random
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from tf_commopt.core.partition.convexity import fill_empty
from tf_commopt.core.partition.local_search import State
from tf_commopt.core.partition.objective import Problem
from tf_commopt.core.partition.pipemodel import PipelineModel

__all__ = ["pipe_improve", "pipe_local_search", "pipe_genetic", "PipeState"]

Plan = Tuple[List[int], List[int]]


class PipeState(State):
    """A :class:`State` that also answers the pipeline model's time for the current plan and for moves."""

    def __init__(self, p: Problem, model: PipelineModel, stage: Sequence[int], devs: Sequence[int]):
        super().__init__(p, stage, devs)
        self.model = model

    def _lists(self, devs: Sequence[int]):
        p = self.p
        ks = [p.kind_of_dev[d] for d in devs]
        fwd = [self.ckf[k][s] for s, k in enumerate(ks)]
        comp = [self.ck[k][s] for s, k in enumerate(ks)]
        return fwd, comp

    def _penalty(self, devs: Sequence[int], pars: Sequence[float], acts: Sequence[float]) -> float:
        p = self.p
        if all(p.mem_cap[d] is None for d in devs):
            return 0.0
        K = p.K
        return max(
            p.penalty_ms(p.weight_versions[s] * pars[s] + (K - s) * acts[s], devs[s]) for s in range(K)
        )

    def value(self, devs: Optional[Sequence[int]] = None) -> float:
        devs = self.devs if devs is None else devs
        fwd, comp = self._lists(devs)
        return self.model.from_parts(fwd, comp, self.hop, devs, self._penalty(devs, self.pars, self.acts))

    def key(self, devs: Optional[Sequence[int]] = None) -> Tuple[float, float]:  # type: ignore[override]
        return (float(f"{self.value(devs):.12g}"), float(f"{sum(self.hop[:-1]):.12g}"))

    def try_key(self, M: Sequence[int], s: int, t: int) -> Tuple[float, float]:
        """The key ``(time, bytes)`` if ``M`` moved from ``s`` to ``t`` (nothing changes)."""
        p = self.p
        dck, dact, dpar, hop_h = self._delta(M, s, t)
        dckf = self.delta_fwd(M)
        fwd, comp = self._lists(self.devs)
        ks, kt = p.kind_of_dev[self.devs[s]], p.kind_of_dev[self.devs[t]]
        fwd[s] -= dckf[ks]
        fwd[t] += dckf[kt]
        comp[s] -= dck[ks]
        comp[t] += dck[kt]
        hop = list(self.hop)
        h = min(s, t)
        hop[h] = max(hop_h, 0.0)
        pen = 0.0
        if any(p.mem_cap[d] is not None for d in self.devs):
            pars, acts = list(self.pars), list(self.acts)
            pars[s] -= dpar
            pars[t] += dpar
            acts[s] -= dact
            acts[t] += dact
            pen = self._penalty(self.devs, pars, acts)
        v = self.model.from_parts(fwd, comp, hop, self.devs, pen)
        return (float(f"{v:.12g}"), float(f"{sum(hop[:-1]):.12g}"))


def _critical_moves(st: PipeState) -> List[Tuple[int, int]]:
    """(from, to) stage pairs worth a branch move: out of the slowest stage, and across the slowest hop."""
    p, K = st.p, st.p.K
    comp = [st.ck[p.kind_of_dev[d]][s] / p.cap[d] for s, d in enumerate(st.devs)]
    sc = max(range(K), key=lambda s: comp[s])
    pairs = [(sc, sc - 1), (sc, sc + 1)]
    if K > 1:
        ht = [st.hop[h] / p.bpm[st.devs[h]][st.devs[h + 1]] for h in range(K - 1)]
        hc = max(range(K - 1), key=lambda h: ht[h])
        if ht[hc] > 0:
            pairs += [(hc, hc + 1), (hc + 1, hc)]
    return [(a, b) for a, b in dict.fromkeys(pairs) if 0 <= a < K and 0 <= b < K]


def pipe_improve(
    st: PipeState,
    max_steps: int = 10_000,
    rng: Optional[random.Random] = None,
    closure_samples: int = 16,
    closure_limit: int = 64,
    focus: bool = False,
) -> int:
    """Best-improvement descent of ``st`` on the pipeline model, in place; returns moves applied.

    ``focus``: single moves only out of the stages next to the slowest stage and the slowest hop (the
    GA's short memetic steps), instead of across every boundary.
    """
    p, K = st.p, st.p.K
    rng = rng or random.Random(0)
    hetero = len(set((p.cap[d], p.kind_of_dev[d]) for d in st.devs)) > 1
    steps = 0
    while steps < max_steps:
        best_key = st.key()
        best = None
        sources = range(K)
        if focus:
            sources = sorted(
                {x for pair in _critical_moves(st) for y in pair for x in (y - 1, y, y + 1) if 0 <= x < K}
            )
        for s in sources:
            if len(st.members[s]) <= 1:
                continue
            for t, front in ((s + 1, st.up_front[s]), (s - 1, st.down_front[s])):
                if not 0 <= t < K:
                    continue
                for v in sorted(front):
                    k = st.try_key([v], s, t)
                    if k < best_key:
                        best, best_key = ("move", [v], s, t), k
        if best is None and hetero:
            for a in range(K):
                for c in range(a + 1, K):
                    devs = list(st.devs)
                    devs[a], devs[c] = devs[c], devs[a]
                    k = st.key(devs)
                    if k < best_key:
                        best, best_key = ("swap", a, c), k
        if best is None:
            for s, t in _critical_moves(st):
                if not 0 <= t < K or len(st.members[s]) <= 1:
                    continue
                pool = sorted(st.members[s])
                if len(pool) > closure_samples:
                    pool = rng.sample(pool, closure_samples)
                for v in pool:
                    M = st.closure(v, t, closure_limit)
                    if M is None or len(M) == 1:
                        continue
                    k = st.try_key(M, s, t)
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


def pipe_local_search(
    p: Problem,
    model: PipelineModel,
    stage: Sequence[int],
    devs: Sequence[int],
    max_steps: int = 10_000,
    seed: int = 0,
) -> Plan:
    """Descend from a convex plan on the pipeline model; returns ``(stage, devs)``."""
    st = PipeState(p, model, stage, devs)
    pipe_improve(st, max_steps=max_steps, rng=random.Random(seed))
    return list(st.stage), list(st.devs)


def _crossover(p: Problem, a: Plan, b: Plan, h: int) -> Plan:
    sa, da = a
    sb, db = b
    child = [x if x <= h else max(y, h + 1) for x, y in zip(sa, sb)]
    child = fill_empty(child, p.pred, p.succ, p.K)
    devs = list(da[: h + 1]) + list(db[h + 1 :])
    if len(set(devs)) != len(devs):
        devs = list(da)
    return child, devs


def pipe_genetic(
    p: Problem,
    model: PipelineModel,
    seeds: Sequence[Plan],
    seed: int = 0,
    pop_size: Optional[int] = None,
    generations: Optional[int] = None,
    ls_steps: Optional[int] = None,
    stall: int = 8,
    cxpb: float = 0.6,
    progress: Optional[Callable[[int, int, float], None]] = None,
) -> Tuple[List[int], List[int], Dict]:
    """The GA of the module docstring from convex ``seeds``; returns ``(stage, devs, info)``.

    ``info``: ``generations`` run, ``improved`` (generations that lowered the best), ``history`` of the
    best time, ``population`` (final distinct plans, best first), ``ga_s``.
    """
    if not seeds:
        raise ValueError("the genetic algorithm needs at least one seed plan")
    rng = random.Random(seed)
    n, K = p.n, p.K
    big = n > 1000
    pop_size = pop_size or (10 if big else 16)
    generations = generations or (10 if big else 25)
    ls_steps = ls_steps if ls_steps is not None else (8 if big else 20)
    hetero = len(set((p.cap[d], p.kind_of_dev[d]) for d in range(p.D))) > 1

    cache: Dict[Tuple, Tuple[float, float]] = {}

    def ident(x: Plan) -> Tuple:
        return tuple(x[0]) + (-1,) + tuple(x[1])

    def fitness(x: Plan) -> Tuple[float, float]:
        k = ident(x)
        f = cache.get(k)
        if f is None:
            st = PipeState(p, model, x[0], x[1])
            f = cache[k] = st.key()
        return f

    def memetic(x: Plan) -> Plan:
        st = PipeState(p, model, x[0], x[1])
        pipe_improve(st, max_steps=ls_steps, rng=rng, closure_samples=8, focus=True)
        return list(st.stage), list(st.devs)

    def mutate(x: Plan) -> Plan:
        st = PipeState(p, model, x[0], x[1])
        r = rng.random()
        if r < 0.25 and K > 2:  # jump: a node to any stage its edges allow
            v = rng.randrange(n)
            lo = max((st.stage[u] for u in p.pred[v]), default=0)
            hi = min((st.stage[w] for w in p.succ[v]), default=K - 1)
            t = rng.randint(lo, hi)
            while st.stage[v] != t and len(st.members[st.stage[v]]) > 1:
                s = st.stage[v]
                st.apply_move([v], s, s + (1 if t > s else -1))
            return list(st.stage), list(st.devs)
        if hetero and r < 0.4 and K > 1:
            a, b = rng.sample(range(K), 2)
            st.swap_devices(a, b)
        elif r < 0.7 and K > 1:  # frontier moves (one stage: nothing to move)
            for _ in range(rng.randint(1, 3)):
                h = rng.randrange(K - 1)
                s, t = (h, h + 1) if rng.random() < 0.5 else (h + 1, h)
                front = st.up_front[s] if t == s + 1 else st.down_front[s]
                if len(st.members[s]) > 1 and front:
                    st.apply_move([rng.choice(sorted(front))], s, t)
        elif K > 1:
            h = rng.randrange(K - 1)
            s, t = (h, h + 1) if rng.random() < 0.5 else (h + 1, h)
            if len(st.members[s]) > 1:
                v = rng.choice(sorted(st.members[s]))
                M = st.closure(v, t, limit=rng.randint(1, max(1, len(st.members[s]) // 2)))
                if M:
                    st.apply_move(M, s, t)
        return list(st.stage), list(st.devs)

    pop: List[Plan] = []
    seen = set()
    for x in sorted(seeds, key=fitness):
        if ident(x) not in seen:
            seen.add(ident(x))
            pop.append((list(x[0]), list(x[1])))
    pop = pop[:pop_size]
    tries = 0
    while len(pop) < pop_size and tries < 3 * pop_size:
        tries += 1
        y = memetic(mutate(pop[tries % len(pop)]))
        if ident(y) not in seen:
            seen.add(ident(y))
            pop.append(y)
    pop.sort(key=fitness)
    best = fitness(pop[0])
    history, improved, since, gen = [best[0]], 0, 0, 0
    t0 = time.perf_counter()
    for gen in range(1, generations + 1):

        def pick() -> Plan:
            return min(rng.sample(pop, min(3, len(pop))), key=fitness)

        children: List[Plan] = []
        while len(children) < len(pop):
            a, b = pick(), pick()
            if K > 1 and rng.random() < cxpb:
                h = rng.randrange(K - 1)
                c1, c2 = _crossover(p, a, b, h), _crossover(p, b, a, h)
            else:
                c1, c2 = (list(a[0]), list(a[1])), (list(b[0]), list(b[1]))
            for c in (c1, c2):
                if rng.random() < 0.5 or ident(c) in seen:
                    c = mutate(c)
                children.append(memetic(c))
        merged, keys = [], set()
        for x in sorted(pop + children, key=fitness):
            if ident(x) not in keys:
                keys.add(ident(x))
                merged.append(x)
        pop = merged[:pop_size]
        seen.update(keys)
        cur = fitness(pop[0])
        history.append(cur[0])
        if cur < best:
            best, since, improved = cur, 0, improved + 1
        else:
            since += 1
        if progress:
            progress(gen, generations, cur[0])
        if since >= stall:
            break
    info = {
        "generations": gen,
        "improved": improved,
        "pop_size": pop_size,
        "history": history,
        "ga_s": time.perf_counter() - t0,
        "population": pop,
    }
    return list(pop[0][0]), list(pop[0][1]), info
