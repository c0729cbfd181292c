"""Re-rank candidate plans by the discrete-event simulator (``partition(..., score="simulated")``).

Example:
    >>> from tf_commopt.core.partition.synthetic import branchy_graph
    >>> from tf_commopt.core.partition import partition
    >>> plan = partition(branchy_graph(60, seed=1), 3, method="ga", score="simulated", schedule="gpipe")
    >>> plan.extra["score"], plan.extra["schedule"], plan.extra["microbatches"]
    ('simulated', 'gpipe', 12)

The search (local search, GA) keeps the fast additive objective of :mod:`objective` (stage compute +
transfers), which ignores that a pipeline overlaps compute with transfers. With ``score="simulated"``
the *choice* among candidates is made by the simulator (:func:`tf_commopt.core.simulate.simulate_pipeline`,
the same rules as the objective for costs and bytes, but compute and transfers overlap):

* **candidates**: every seed of the search (``layerwise``; ``balanced`` and ``pipedream`` under every
  device order tried; their local-search results; for ``ga`` also the exact contiguous optimum of the
  objective over two topological orders and its local-search result) plus the GA's final population
  (the ``pop_size`` best distinct plans under the objective);
* **rule**: the plan with the smallest key ``(violates the memory cap, simulated time, objective,
  bytes crossing)``, where the simulated time is the GPipe iteration time, or for 1F1B the time per
  mini-batch ``1000 / throughput`` (steady state);
* **guarantee** (by construction, since the baseline plans are candidates): with no memory cap, the
  returned plan's simulated time is never larger than that of the ``layerwise``, ``balanced`` or
  ``pipedream`` plan on the same graph, cluster, schedule and micro-batch count.

Default micro-batches: ``4 * num_stages`` for GPipe (each ``1/M`` of the profiled mini-batch) and
``8 * num_stages`` for 1F1B (each a full profiled mini-batch), as in ``experiments/pipeline_bench.py``.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

from tf_commopt.core.partition.objective import Problem
from tf_commopt.core.partition.plan import PartitionPlan
from tf_commopt.errors import InputError

__all__ = ["SCORES", "SIM_SCHEDULES", "check_score", "default_microbatches", "simulated_ms", "best_simulated"]

SCORES = ("objective", "simulated")
SIM_SCHEDULES = ("gpipe", "1f1b")
Plan = Tuple[List[int], List[int]]


def check_score(score: str, schedule: str, microbatches: Optional[int]) -> None:
    """InputError naming the argument if ``score``/``schedule``/``microbatches`` is not valid."""
    if score not in SCORES:
        raise InputError(f"unknown score {score!r}; choose from {', '.join(SCORES)}", where="score")
    if schedule not in SIM_SCHEDULES:
        raise InputError(f"unknown schedule {schedule!r}; choose from {', '.join(SIM_SCHEDULES)}", where="schedule")
    if microbatches is not None and (isinstance(microbatches, bool) or not isinstance(microbatches, int)
                                     or microbatches < 1):
        raise InputError(f"microbatches must be a positive integer, got {microbatches!r}", where="microbatches")


def default_microbatches(schedule: str, num_stages: int) -> int:
    """``4 K`` micro-batches for GPipe, ``8 K`` streamed mini-batches for 1F1B."""
    return (4 if schedule == "gpipe" else 8) * num_stages


def simulated_ms(p: Problem, plan: PartitionPlan, schedule: str, microbatches: int) -> float:
    """Simulated ms per mini-batch of ``plan`` on ``p.cluster``: GPipe iteration, or 1000/throughput (1F1B)."""
    from tf_commopt.core.simulate.pipeline import simulate_pipeline  # lazy: simulate imports partition.plan

    r = simulate_pipeline(p.graph, plan, schedule, microbatches=microbatches, cluster=p.cluster)
    if schedule == "gpipe":
        return float(r.iteration_ms)
    return 1000.0 / r.throughput if r.throughput > 0 else float("inf")


def best_simulated(p: Problem, candidates: Sequence[Plan], to_plan: Callable[[Sequence[int], Sequence[int]], PartitionPlan],
                   schedule: str, microbatches: int) -> Tuple[Plan, Dict]:
    """The candidate with the smallest ``(infeasible, simulated ms, objective, bytes)``; and ranking info."""
    seen, ranked = set(), []
    for stage, devs in candidates:
        k = tuple(stage) + (-1,) + tuple(devs)
        if k in seen:
            continue
        seen.add(k)
        plan = to_plan(stage, devs)
        infeasible = not plan.extra.get("feasible", True)
        sim = simulated_ms(p, plan, schedule, microbatches)
        ranked.append(((infeasible, float(f"{sim:.12g}"), float(f"{plan.objective:.12g}"), plan.comm_bytes),
                       (list(stage), list(devs))))
    ranked.sort(key=lambda x: x[0])
    best_key, best = ranked[0]
    info = {"simulated_ms": best_key[1], "candidates_simulated": len(ranked),
            "objective_best_simulated_ms": min((k for k, _ in ranked), key=lambda k: (k[0], k[2], k[3]))[1]}
    return best, info
