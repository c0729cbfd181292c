"""How each method finds its plan: the seeds, the local searches and the genetic algorithm, per score.

Example:
    >>> from tf_commopt.core.devices import Cluster
    >>> from tf_commopt.core.partition.objective import Problem
    >>> from tf_commopt.core.partition.pipemodel import PipelineModel
    >>> from tf_commopt.core.partition.search import pipeline_search
    >>> from tf_commopt.core.partition.synthetic import branchy_graph
    >>> p = Problem(branchy_graph(60, seed=1), Cluster.homogeneous(3), 3)
    >>> found = pipeline_search(p, "local", 0, None, PipelineModel(p, "gpipe", 12))
    >>> found.best == min(found.candidates, key=found.key), len(found.baselines)
    (True, 4)

* **Baselines** keep their own rule for the split (:mod:`baselines`); among their device orders (and,
  for ``pipedream``, among the splits tied at PipeDream's optimum) the score chooses.
* **Seeds** (``local`` and ``ga``): layerwise; balanced, PipeDream's ties and the exact contiguous
  optimum of the additive objective over Kahn's and depth-first orders, each under every device order;
  the objective's local search from the balanced and PipeDream plans.
* **Pipeline score**: the memetic descent on the pipeline time (:func:`pipesearch.pipe_local_search`)
  from the best four seeds; ``ga`` then runs :func:`evolve.evolve` from all of them.
* **Objective score**: the objective's local search from the balanced and PipeDream plans; ``ga`` then
  runs :func:`evolve.evolve` with :func:`evolve.objective_score`.

Device orders (:func:`device_orders`): the given one, and on heterogeneous clusters also fastest-first
and slowest-first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from tf_commopt.core.partition import baselines
from tf_commopt.core.partition.convexity import dfs_topological_order
from tf_commopt.core.partition.evolve import Evolution, evolve, objective_score, pipeline_score
from tf_commopt.core.partition.local_search import local_search
from tf_commopt.core.partition.objective import Problem
from tf_commopt.core.partition.operators import Plan, distinct
from tf_commopt.core.partition.pipemodel import PipelineModel
from tf_commopt.core.partition.pipesearch import pipe_local_search

__all__ = ["Found", "device_orders", "pipeline_search", "objective_search"]

Progress = Optional[Callable[[int, int, float], None]]


@dataclass
class Found:
    """A search's result: its ``best`` plan under ``key``, every ``candidate`` it considered (the
    baselines first), the ``baselines`` themselves and what to record in the plan's ``extra``."""

    best: Plan
    key: Callable[[Plan], Tuple]
    candidates: List[Plan]
    baselines: List[Plan]
    extra: Dict = field(default_factory=dict)


def device_orders(p: Problem) -> List[List[int]]:
    """The default device order, and on heterogeneous clusters also fastest-first and slowest-first."""
    devs = p.default_devices()
    orders = [devs]
    if len(set((p.cap[d], p.kind_of_dev[d]) for d in devs)) > 1:
        speed = {d: p.cap[d] * p.comp[0].sum() / max(p.comp[p.kind_of_dev[d]].sum(), 1e-12) for d in devs}
        orders.append(sorted(devs, key=lambda d: (-speed[d], d)))
        orders.append(sorted(devs, key=lambda d: (speed[d], d)))
    out: List[List[int]] = []
    for o in orders:
        if o not in out:
            out.append(o)
    return out


def _by_objective(p: Problem, fn) -> Plan:
    return min(((fn(p, o), o) for o in device_orders(p)), key=lambda sd: p.objective(*sd))


def _baselines(p: Problem) -> Tuple[List[Plan], List[Plan], List[Plan]]:
    """(layerwise, balanced under every device order, PipeDream's ties under every device order)."""
    orders = device_orders(p)
    lw = [(baselines.layerwise(p, p.default_devices()), p.default_devices())]
    bal = [(baselines.balanced(p, o), o) for o in orders]
    pd = [(s, o) for o in orders for s in baselines.pipedream_ties(p, o)]
    return lw, bal, pd


def _contiguous(p: Problem) -> List[Plan]:
    """The exact contiguous optimum of the objective over Kahn's and depth-first orders, every device order."""
    dfs = dfs_topological_order(p.pred, p.succ)
    return [(baselines.contiguous_optimal(p, o, perm), o) for o in device_orders(p) for perm in (None, dfs)]


def _ga_extra(ev: Evolution) -> Dict:
    return {"generations": ev.generations, "improved": ev.improved, "pop_size": len(ev.population),
            "ga_s": ev.seconds}  # fmt: skip


def pipeline_search(p: Problem, method: str, seed: int, progress: Progress, model: PipelineModel) -> Found:
    """Search and choose by ``model``'s pipeline time, then bytes (see the module docstring)."""

    def key(sd: Plan) -> Tuple[float, float]:
        return (float(f"{model.time(*sd):.12g}"), float(f"{p.evaluate(*sd).comm_bytes:.12g}"))

    lw, bal, pd = _baselines(p)
    base = lw + bal + pd
    if method in ("layerwise", "balanced", "pipedream"):
        pick = {"layerwise": lw, "balanced": bal, "pipedream": pd}[method]
        return Found(min(pick, key=key), key, base, base)
    starts = [_by_objective(p, baselines.balanced), _by_objective(p, baselines.pipedream)]
    more = _contiguous(p) + [local_search(p, s, d, seed=seed) for s, d in starts]
    seeds = sorted(distinct(base + more), key=key)
    extra: Dict = {"seeds_best_ms": key(seeds[0])[0]}
    t_ls = time.perf_counter()
    improved = [pipe_local_search(p, model, s, d, seed=seed) for s, d in seeds[:4]]
    extra["local_s"] = time.perf_counter() - t_ls
    candidates = seeds + improved
    extra["local_best_ms"] = min(key(c) for c in candidates)[0]
    if method == "ga":
        ev = evolve(p, pipeline_score(p, model), candidates, seed=seed, progress=progress)
        candidates = candidates + ev.population
        extra.update(_ga_extra(ev))
        extra["ga_best_ms"] = ev.key[0]
    best = min(candidates, key=key)
    extra["model_ms"] = key(best)[0]
    return Found(best, key, base + candidates, base, extra)


def objective_search(p: Problem, method: str, seed: int, progress: Progress) -> Found:
    """Search and choose by the additive objective (see the module docstring)."""

    def key(sd: Plan) -> Tuple[float, float]:
        ev = p.evaluate(*sd)
        return (float(f"{ev.objective:.12g}"), float(f"{ev.comm_bytes:.12g}"))

    if method == "layerwise":
        devs = p.default_devices()
        plan = (baselines.layerwise(p, devs), devs)
        return Found(plan, key, [plan], [plan])
    if method in ("balanced", "pipedream"):
        plan = _by_objective(p, getattr(baselines, method))
        return Found(plan, key, [plan], [plan])
    starts = [_by_objective(p, baselines.balanced), _by_objective(p, baselines.pipedream)]
    locals_ = [local_search(p, s, d, seed=seed) for s, d in starts]
    if method == "local":
        return Found(min(locals_, key=lambda sd: p.objective(*sd)), key, starts + locals_, starts)
    contiguous = _contiguous(p)
    more = contiguous + [local_search(p, s, d, seed=seed) for s, d in contiguous]
    devs = p.default_devices()
    seeds = sorted(distinct([(baselines.layerwise(p, devs), devs)] + starts + locals_ + more), key=key)
    ev = evolve(p, objective_score(p), seeds, seed=seed, progress=progress)
    candidates = seeds + ev.population
    return Found(min(candidates, key=key), key, candidates, starts, _ga_extra(ev))
