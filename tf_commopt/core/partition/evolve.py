"""The partitioner's genetic algorithm: one engine on DEAP's toolbox for every score.

Example:
    >>> from tf_commopt.core.devices import Cluster
    >>> from tf_commopt.core.partition.baselines import balanced
    >>> from tf_commopt.core.partition.evolve import evolve, pipeline_score
    >>> from tf_commopt.core.partition.objective import Problem
    >>> from tf_commopt.core.partition.pipemodel import PipelineModel
    >>> from tf_commopt.core.partition.synthetic import branchy_graph
    >>> p = Problem(branchy_graph(120, seed=3), Cluster.homogeneous(4, bandwidth_gbps=10), 4)
    >>> score = pipeline_score(p, PipelineModel(p, "gpipe", 16))
    >>> start = (balanced(p, [0, 1, 2, 3]), [0, 1, 2, 3])
    >>> result = evolve(p, score, [start], seed=0)
    >>> result.key <= score.key(score.state(*start)), result.logbook.select("gen")[:3]
    (True, [0, 1, 2])

A :class:`Score` says what is minimised and how a plan is locally improved: :func:`pipeline_score`
(the pipeline model of the schedule that will run, :mod:`pipemodel`, with the memetic descent of
:mod:`pipesearch`) or :func:`objective_score` (the additive objective of :mod:`objective`, with
:func:`local_search.improve`). The engine is the same for both:

* **individual**: the stage of every node (topological order) with the devices of the stages
  (``ind.devs``); fitness ``(time, bytes crossing stage boundaries)``, minimised lexicographically;
* **population**: the distinct seeds, best first, at most ``pop_size``, topped up with mutated and
  improved copies of them;
* **selection**: tournaments of 3 distinct individuals, drawn from the run's ``random.Random(seed)``
  (so a run is deterministic and leaves the ``random`` module alone);
* **crossover** (probability ``cxpb``): :func:`operators.boundary_crossover` at a random boundary;
* **mutation** (probability ``mutpb``, always for a child equal to a plan already seen):
  :func:`operators.mutate` (a jump, frontier moves, a branch move or a device swap), or with
  probability ``resplit`` the exact contiguous optimum of the plan's own stage order
  (:func:`baselines.contiguous_optimal`), which moves every boundary at once;
* **memetic step**: every child is improved by the score's local search (``ls_steps`` moves);
* **survivors**: the best ``pop_size`` distinct plans of parents and children (elitist: the best never
  gets worse); every ``resplit_best`` generations the re-split of the best plan joins the children;
* **hall of fame** (``tools.HallOfFame``) keeps the best plan; **statistics and logbook**
  (``tools.Statistics``, ``tools.Logbook``): best and mean time per generation, which feed the
  ``progress`` callback;
* stops after ``generations``, or ``stall`` generations without a better plan. The final population
  (best first) is returned with the best plan: the planner ranks it with its other candidates.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, replace
from typing import Callable, List, Optional, Sequence, Tuple

from deap import base, creator, tools

from tf_commopt.core.partition.baselines import contiguous_optimal
from tf_commopt.core.partition.local_search import State, improve
from tf_commopt.core.partition.objective import Problem
from tf_commopt.core.partition.operators import Plan, boundary_crossover, distinct, is_hetero, mutate
from tf_commopt.core.partition.pipemodel import PipelineModel
from tf_commopt.core.partition.pipesearch import PipeState, pipe_improve

__all__ = ["Settings", "Score", "Evolution", "evolve", "pipeline_score", "objective_score"]

if not hasattr(creator, "TfcPlanFitness"):
    creator.create("TfcPlanFitness", base.Fitness, weights=(-1.0, -1.0))
if not hasattr(creator, "TfcPlan"):
    creator.create("TfcPlan", list, fitness=creator.TfcPlanFitness, devs=None)

Key = Tuple[float, float]


@dataclass(frozen=True)
class Settings:
    """The GA's parameters (see the module docstring)."""

    pop_size: int
    generations: int
    ls_steps: int
    stall: int
    cxpb: float
    mutpb: float
    resplit: float = 0.0
    resplit_best: int = 0


@dataclass(frozen=True)
class Score:
    """What the GA minimises: ``state(stage, devs)`` builds an incremental state, ``key(state)`` is the
    fitness, ``improve(state, steps, rng)`` the memetic local search (in place); ``settings`` the
    default parameters for this score and graph."""

    name: str
    state: Callable[[Sequence[int], Sequence[int]], State]
    key: Callable[[State], Key]
    improve: Callable[[State, int, random.Random], None]
    settings: Settings


def pipeline_score(p: Problem, model: PipelineModel) -> Score:
    """The pipeline time of ``model``'s schedule; short memetic descents focused on the slowest stage."""
    big = p.n > 1000

    def improve_(st: State, steps: int, rng: random.Random) -> None:
        pipe_improve(st, max_steps=steps, rng=rng, closure_samples=8, focus=True)  # type: ignore[arg-type]

    return Score(
        "pipeline",
        lambda s, d: PipeState(p, model, s, d),
        lambda st: st.key(),
        improve_,
        Settings(pop_size=10 if big else 16, generations=10 if big else 25, ls_steps=8 if big else 20,
                 stall=8, cxpb=0.6, mutpb=0.5),
    )  # fmt: skip


def objective_score(p: Problem) -> Score:
    """The additive objective (slowest stage), then bytes; re-splits of stage orders on small graphs."""
    big = p.n > 1000

    def key(st: State) -> Key:
        return (float(f"{max(st.times):.12g}"), float(f"{sum(st.hop[:-1]):.12g}"))

    def improve_(st: State, steps: int, rng: random.Random) -> None:
        improve(st, max_steps=steps, rng=rng, closure_samples=12)

    return Score(
        "objective",
        lambda s, d: State(p, s, d),
        key,
        improve_,
        Settings(pop_size=16 if big else 24, generations=25 if big else 40, ls_steps=20 if big else 40,
                 stall=12, cxpb=0.5, mutpb=0.5, resplit=0.0 if big else 0.15, resplit_best=8 if big else 1),
    )  # fmt: skip


@dataclass
class Evolution:
    """The GA's result: the best plan and its key, the final population (best first), the logbook,
    generations run, generations that improved the best, and seconds."""

    stage: List[int]
    devs: List[int]
    key: Key
    population: List[Plan]
    logbook: tools.Logbook
    generations: int
    improved: int
    seconds: float


def _ident(ind) -> Tuple:
    return tuple(ind) + (-1,) + tuple(ind.devs)


def _make(stage: Sequence[int], devs: Sequence[int]):
    ind = creator.TfcPlan(stage)
    ind.devs = list(devs)
    return ind


def _clone(ind):
    c = _make(ind, ind.devs)
    if ind.fitness.valid:
        c.fitness.values = ind.fitness.values
    return c


def _tournament(pop: Sequence, k: int, rng: random.Random, size: int = 3) -> list:
    """``k`` tournament winners: each the fittest of ``size`` distinct individuals drawn from ``rng``."""
    return [min(rng.sample(pop, min(size, len(pop))), key=lambda x: x.fitness.values) for _ in range(k)]


class _Run:
    """One run of the engine: the toolbox, the set of plans seen, and the steps of a generation."""

    def __init__(self, p: Problem, score: Score, cfg: Settings, rng: random.Random):
        self.p, self.score, self.cfg, self.rng = p, score, cfg, rng
        self.seen: set = set()
        self.nevals = 0
        tb = self.tb = base.Toolbox()
        tb.register("evaluate", lambda ind: score.key(score.state(ind, ind.devs)))
        tb.register("mate", self._mate)
        tb.register("mutate", mutate, rng=rng, hetero=is_hetero(p))
        tb.register("improve", score.improve, steps=cfg.ls_steps, rng=rng)
        tb.register("select", _tournament, rng=rng)
        tb.register("clone", _clone)

    def _mate(self, a, b):
        h = self.rng.randrange(self.p.K - 1)
        (sa, da), (sb, db) = (
            boundary_crossover(self.p, (a, a.devs), (b, b.devs), h),
            boundary_crossover(self.p, (b, b.devs), (a, a.devs), h),
        )
        a[:], a.devs, b[:], b.devs = sa, da, sb, db
        del a.fitness.values, b.fitness.values
        return a, b

    def resplit(self, ind):
        """The exact contiguous optimum of ``ind``'s stage order (stage, then index), on its devices."""
        order = sorted(range(self.p.n), key=lambda v: (ind[v], v))
        return self.score.state(contiguous_optimal(self.p, ind.devs, order), ind.devs)

    def develop(self, ind, mutated: bool) -> None:
        """Mutate (if ``mutated``), improve and evaluate ``ind`` in place. Each step starts from a state
        built afresh, so the result does not depend on rounding in the incremental updates."""
        if mutated and self.cfg.resplit and self.rng.random() < self.cfg.resplit:
            st = self.resplit(ind)
        else:
            st = self.score.state(ind, ind.devs)
            if mutated:
                self.tb.mutate(st)
                st = self.score.state(st.stage, st.devs)
        self.tb.improve(st)
        ind[:], ind.devs = st.stage, list(st.devs)
        ind.fitness.values = self.tb.evaluate(ind)
        self.nevals += 1

    def initial(self, seeds: Sequence[Plan]) -> list:
        """The distinct seeds, best first, at most ``pop_size``, topped up with developed copies."""
        pop = [_make(s, d) for s, d in distinct(seeds)]
        for ind in pop:
            ind.fitness.values = self.tb.evaluate(ind)
        self.seen.update(_ident(x) for x in pop)
        pop = tools.selBest(pop, min(self.cfg.pop_size, len(pop)))
        tries = 0
        while len(pop) < self.cfg.pop_size and tries < 3 * self.cfg.pop_size:
            tries += 1
            ind = self.tb.clone(pop[tries % len(pop)])
            self.develop(ind, mutated=True)
            if _ident(ind) not in self.seen:
                self.seen.add(_ident(ind))
                pop.append(ind)
        return tools.selBest(pop, len(pop))

    def generation(self, pop: list, best) -> list:
        """Selection, crossover, mutation and memetic step; the survivors of parents and children."""
        self.nevals = 0
        offspring: list = []
        while len(offspring) < len(pop):
            a, b = (self.tb.clone(x) for x in self.tb.select(pop, 2))
            if self.p.K > 1 and self.rng.random() < self.cfg.cxpb:
                self.tb.mate(a, b)
            for ind in (a, b):
                self.develop(ind, mutated=self.rng.random() < self.cfg.mutpb or _ident(ind) in self.seen)
                offspring.append(ind)
        if best is not None:
            offspring.append(self._resplit_best(best))
        merged, keys = [], set()
        for ind in tools.selBest(pop + offspring, len(pop) + len(offspring)):
            if _ident(ind) not in keys:
                keys.add(_ident(ind))
                merged.append(ind)
        self.seen.update(keys)
        return merged[: self.cfg.pop_size]

    def _resplit_best(self, best):
        st = self.resplit(best)
        self.score.improve(st, 4 * self.cfg.ls_steps, self.rng)
        ind = _make(st.stage, st.devs)
        ind.fitness.values = self.tb.evaluate(ind)
        self.nevals += 1
        return ind


def evolve(
    p: Problem,
    score: Score,
    seeds: Sequence[Plan],
    seed: int = 0,
    progress: Optional[Callable[[int, int, float], None]] = None,
    **settings,
) -> Evolution:
    """Run the GA of the module docstring from convex ``seeds``.

    Args:
        p: the problem (graph, cluster, number of stages).
        score: :func:`pipeline_score` or :func:`objective_score`.
        seeds: convex ``(stage, devs)`` plans (at least one).
        seed: the random seed (same seed, same result).
        progress: ``progress(generation, generations, best time)``, read from the logbook.
        settings: overrides of :class:`Settings` fields (e.g. ``generations=5``).
    """
    if not seeds:
        raise ValueError("the genetic algorithm needs at least one seed plan")
    cfg = replace(score.settings, **settings)
    run = _Run(p, score, cfg, random.Random(seed))
    stats = tools.Statistics(key=lambda ind: ind.fitness.values[0])
    stats.register("min", min)
    stats.register("avg", statistics.fmean)
    logbook = tools.Logbook()
    logbook.header = ("gen", "nevals", "min", "avg")
    hof = tools.HallOfFame(1, similar=lambda a, b: _ident(a) == _ident(b))
    t0 = time.perf_counter()
    pop = run.initial(seeds)
    hof.update(pop)
    logbook.record(gen=0, nevals=len(pop), **stats.compile(pop))
    best_key, since, improved, gen, last = hof[0].fitness.values, 0, 0, 0, None
    for gen in range(1, cfg.generations + 1):
        resplit = bool(cfg.resplit_best) and gen % cfg.resplit_best == 0 and _ident(hof[0]) != last
        last = _ident(hof[0]) if resplit else last
        pop = run.generation(pop, hof[0] if resplit else None)
        hof.update(pop)
        logbook.record(gen=gen, nevals=run.nevals, **stats.compile(pop))
        if progress:
            progress(gen, cfg.generations, logbook[-1]["min"])
        if hof[0].fitness.values < best_key:
            best_key, since, improved = hof[0].fitness.values, 0, improved + 1
        else:
            since += 1
        if since >= cfg.stall:
            break
    b = hof[0]
    population = [(list(x), list(x.devs)) for x in pop]
    return Evolution(
        list(b),
        list(b.devs),
        tuple(b.fitness.values),
        population,
        logbook,
        gen,
        improved,
        time.perf_counter() - t0,
    )
