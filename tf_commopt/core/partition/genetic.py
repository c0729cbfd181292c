"""Genetic algorithm (DEAP) over convex stage assignments, with repair and local search as mutation.

Example:
    >>> from tf_commopt.core.partition.synthetic import branchy_graph
    >>> from tf_commopt.core.devices import Cluster
    >>> from tf_commopt.core.partition.objective import Problem
    >>> from tf_commopt.core.partition.baselines import balanced
    >>> from tf_commopt.core.partition.genetic import genetic
    >>> p = Problem(branchy_graph(120, seed=3), Cluster.homogeneous(4, bandwidth_gbps=10), 4)
    >>> seed_plan = (balanced(p, [0, 1, 2, 3]), [0, 1, 2, 3])
    >>> stage, devs, info = genetic(p, [seed_plan], seed=0)
    >>> p.objective(stage, devs) <= p.objective(*seed_plan)
    True

The memetic GA (thesis 000's "genetic algorithm finds the partition"; DEAP: Fortin et al., JMLR 2012):

* **Individual**: the stage of every node (nodes in topological order) plus the device of every stage.
* **Population**: the seeds (baselines and local-search results, de-duplicated), topped up with
  mutated copies of them; size ``pop_size``.
* **Fitness**: the objective of :mod:`objective` (minimised; rounded to 12 significant digits), then
  the bytes crossing stage boundaries as a tie-break (DEAP compares fitnesses lexicographically); one
  full O(n + e) numpy evaluation.
* **Selection**: tournaments of 3 pick parents; the next population is the best ``pop_size``
  *distinct* individuals of parents + offspring (elitist, so the best never gets worse: the result is
  never worse than any seed).
* **Crossover** (prob. ``cxpb``): either the element-wise min and max of the two parents (monotone
  labellings stay monotone) or a one-point crossover in topological order; children are *repaired*
  (:func:`convexity.repair`) to convex K-stage assignments; each child keeps one parent's devices.
* **Mutation** (prob. ``mutpb``): on graphs up to 1,000 nodes, with probability 0.15 the individual's
  stage order is re-split by the exact contiguous DP (see re-balancing) and locally improved; otherwise 1-3 random block moves (a node and its in-stage descendants or
  ancestors across a boundary), a random swap of two stages' devices (heterogeneous clusters), then
  ``ls_steps`` steps of :func:`local_search.improve`.
* **Re-balancing**: every ``dp_every`` generations (1, or 8 above 1,000 nodes), if the best individual
  changed, its stage order defines a topological order (by stage, then index) whose exact contiguous
  optimum (:func:`baselines.contiguous_optimal`), locally improved, joins the population: it moves
  every boundary at once, which single moves cannot.
* Stops after ``generations`` or ``stall`` generations without a better fitness. Deterministic for a seed:
  all randomness comes from ``random.Random(seed)`` (DEAP's tournament draws from the global ``random``
  module, which is seeded from it and restored afterwards).
"""

from __future__ import annotations

import random
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from deap import base, creator, tools

from tf_commopt.core.partition.baselines import contiguous_optimal
from tf_commopt.core.partition.convexity import fill_empty, repair
from tf_commopt.core.partition.local_search import State, improve
from tf_commopt.core.partition.objective import Problem

__all__ = ["genetic"]

if not hasattr(creator, "TfcFitnessObjBytes"):
    creator.create("TfcFitnessObjBytes", base.Fitness, weights=(-1.0, -1.0))
if not hasattr(creator, "TfcPlan2"):
    creator.create("TfcPlan2", list, fitness=creator.TfcFitnessObjBytes, devs=None)

Plan = Tuple[List[int], List[int]]


def _make(stage: Sequence[int], devs: Sequence[int]):
    ind = creator.TfcPlan2(stage)
    ind.devs = list(devs)
    return ind


def genetic(
    p: Problem,
    seeds: Sequence[Plan],
    seed: int = 0,
    pop_size: Optional[int] = None,
    generations: Optional[int] = None,
    cxpb: float = 0.5,
    mutpb: float = 0.5,
    ls_steps: Optional[int] = None,
    stall: int = 12,
    dp_every: Optional[int] = None,
    progress: Optional[Callable[[int, int, float], None]] = None,
) -> Tuple[List[int], List[int], Dict]:
    """Run the GA from ``seeds`` (convex ``(stage, devs)`` pairs); returns ``(stage, devs, info)``."""
    if not seeds:
        raise ValueError("the genetic algorithm needs at least one seed plan")
    rng = random.Random(seed)
    n, K = p.n, p.K
    big = n > 1000
    pop_size = pop_size or (16 if big else 24)
    generations = generations or (25 if big else 40)
    ls_steps = ls_steps if ls_steps is not None else (20 if big else 40)
    dp_every = dp_every if dp_every is not None else (8 if big else 1)
    dp_mut = 0.0 if big else 0.15
    hetero = len(set((p.cap[d], p.kind_of_dev[d]) for d in range(p.D))) > 1 or p.D > K
    spare = [d for d in range(p.D)]

    def evaluate(ind) -> Tuple[float, float]:
        ev = p.evaluate(ind, ind.devs)
        return (float(f"{ev.objective:.12g}"), ev.comm_bytes)

    def mutate(ind):
        if dp_mut and rng.random() < dp_mut:  # re-split this individual's stage order optimally
            order = sorted(range(n), key=lambda v: (ind[v], v))
            st = State(p, contiguous_optimal(p, ind.devs, order), ind.devs)
            improve(st, max_steps=ls_steps, rng=rng, closure_samples=12)
            ind[:] = st.stage
            del ind.fitness.values
            return (ind,)
        st = State(p, ind, ind.devs)
        for _ in range(rng.randint(1, 3)):
            if K < 2:
                break
            h = rng.randrange(K - 1)
            s, t = (h, h + 1) if rng.random() < 0.5 else (h + 1, h)
            if len(st.members[s]) <= 1:
                continue
            v = rng.choice(sorted(st.members[s]))
            M = st.closure(v, t, limit=rng.randint(1, max(1, len(st.members[s]) // 2)))
            if M:
                st.apply_move(M, s, t)
        if hetero and rng.random() < 0.3:
            a, b = rng.sample(range(K), 2) if K > 1 else (0, 0)
            if a != b:
                st.swap_devices(a, b)
            if p.D > K and rng.random() < 0.5:  # bring in an unused device
                unused = [d for d in spare if d not in st.devs]
                if unused:
                    st.devs[rng.randrange(K)] = rng.choice(unused)
                    st.times = [st.stage_time(x) for x in range(K)]
        improve(st, max_steps=ls_steps, rng=rng, closure_samples=12)
        ind[:] = st.stage
        ind.devs = list(st.devs)
        del ind.fitness.values
        return (ind,)

    def mate(a, b):
        if rng.random() < 0.5:
            c1 = [min(x, y) for x, y in zip(a, b)]
            c2 = [max(x, y) for x, y in zip(a, b)]
            c1, c2 = fill_empty(c1, p.pred, p.succ, K), fill_empty(c2, p.pred, p.succ, K)
        else:
            cut = rng.randrange(1, n) if n > 1 else 0
            c1 = repair(list(a[:cut]) + list(b[cut:]), p.pred, p.succ, K)
            c2 = repair(list(b[:cut]) + list(a[cut:]), p.pred, p.succ, K)
        a[:], b[:] = c1, c2
        del a.fitness.values
        del b.fitness.values
        return a, b

    tb = base.Toolbox()
    tb.register("evaluate", evaluate)
    tb.register("mate", mate)
    tb.register("mutate", mutate)
    tb.register("select", tools.selTournament, tournsize=3)

    def clone(ind):
        c = _make(ind, ind.devs)
        if ind.fitness.valid:
            c.fitness.values = ind.fitness.values
        return c

    tb.register("clone", clone)

    def key(ind) -> Tuple:
        return tuple(ind) + tuple(ind.devs)

    pop, seen = [], set()
    for stage, devs in seeds:
        ind = _make(stage, devs)
        if key(ind) not in seen:
            seen.add(key(ind))
            ind.fitness.values = tb.evaluate(ind)
            pop.append(ind)
    base_pop = list(pop)
    tries = 0
    while len(pop) < pop_size and tries < 3 * pop_size:
        tries += 1
        ind = tb.clone(base_pop[tries % len(base_pop)])
        tb.mutate(ind)
        if key(ind) not in seen:
            seen.add(key(ind))
            ind.fitness.values = tb.evaluate(ind)
            pop.append(ind)
    hof = tools.HallOfFame(1)
    hof.update(pop)
    since, gen, last_dp = 0, 0, None
    best_fit = hof[0].fitness.values
    history = [best_fit[0]]
    saved = random.getstate()
    random.seed(rng.random())
    t0 = time.perf_counter()
    try:
        for gen in range(1, generations + 1):
            offspring = [tb.clone(x) for x in tb.select(pop, len(pop))]
            for i in range(1, len(offspring), 2):
                if rng.random() < cxpb:
                    tb.mate(offspring[i - 1], offspring[i])
            for ind in offspring:
                if rng.random() < mutpb:
                    tb.mutate(ind)
            if dp_every and gen % dp_every == 0 and key(hof[0]) != last_dp:
                b = hof[0]
                last_dp = key(b)
                order = sorted(range(n), key=lambda v: (b[v], v))
                st = State(p, contiguous_optimal(p, b.devs, order), b.devs)
                improve(st, max_steps=4 * ls_steps, rng=rng)
                offspring.append(_make(st.stage, st.devs))
            for ind in offspring:
                if not ind.fitness.valid:
                    ind.fitness.values = tb.evaluate(ind)
            merged, keys = [], set()
            for ind in sorted(pop + offspring, key=lambda x: x.fitness.values):
                k = key(ind)
                if k not in keys:
                    keys.add(k)
                    merged.append(ind)
            pop = merged[:pop_size]
            hof.update(pop)
            cur = hof[0].fitness.values[0]
            history.append(cur)
            if hof[0].fitness.values < best_fit:
                best_fit, since = hof[0].fitness.values, 0
            else:
                since += 1
            if progress:
                progress(gen, generations, cur)
            if since >= stall:
                break
    finally:
        random.setstate(saved)
    b = hof[0]
    info = {
        "generations": gen,
        "pop_size": pop_size,
        "history": history,
        "ga_s": time.perf_counter() - t0,
        "population": [(list(x), list(x.devs)) for x in pop],
    }
    return list(b), list(b.devs), info
