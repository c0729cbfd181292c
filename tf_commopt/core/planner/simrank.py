"""Rank candidate plans in the discrete-event simulator (the final choice of ``score="simulated"``).

Example:
    >>> from tf_commopt.core.partition.synthetic import branchy_graph
    >>> from tf_commopt.core.planner import partition
    >>> plan = partition(branchy_graph(60, seed=1), 3, method="ga", schedule="gpipe")
    >>> plan.extra["score"], plan.schedule, plan.microbatches
    ('simulated', 'gpipe', 12)

* **candidates**: what the pipeline search (:func:`tf_commopt.core.partition.api.partition`) considered:
  every seed (``layerwise``; ``balanced``, PipeDream's tied optima and the exact contiguous optimum of
  the additive objective under every device order tried; objective local-search results), the memetic
  local-search results and, for ``ga``, its final population;
* **rule**: the plan with the smallest key ``(violates the memory cap, simulated time, pipeline-model
  time, bytes crossing)``, the simulated time being the GPipe iteration time, or for 1F1B the time per
  mini-batch ``1000 / throughput`` (steady state). To bound the cost only the baseline plans (always)
  and the ``top`` best by the pipeline model are simulated;
* **guarantee** (by construction, since the baseline plans are candidates): with no memory cap, the
  returned plan's simulated time is never larger than that of the ``layerwise``, ``balanced`` or
  ``pipedream`` plan on the same graph, cluster, schedule and micro-batch count.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

from tf_commopt.core.partition.objective import Problem
from tf_commopt.core.partition.pipemodel import PipelineModel
from tf_commopt.core.plan import PartitionPlan
from tf_commopt.core.simulate.pipeline import simulate_pipeline

__all__ = ["simulated_ms", "best_simulated", "simulator_ranker"]

Plan = Tuple[List[int], List[int]]


def simulated_ms(p: Problem, plan: PartitionPlan, schedule: str, microbatches: int) -> float:
    """Simulated ms per mini-batch of ``plan`` on ``p.cluster``: GPipe iteration, or 1000/throughput (1F1B)."""
    r = simulate_pipeline(p.graph, plan, schedule, microbatches=microbatches, cluster=p.cluster)
    if schedule == "gpipe":
        return float(r.iteration_ms)
    return 1000.0 / r.throughput if r.throughput > 0 else float("inf")


def best_simulated(
    p: Problem,
    candidates: Sequence[Plan],
    to_plan: Callable[[Sequence[int], Sequence[int]], PartitionPlan],
    schedule: str,
    microbatches: int,
    top: Optional[int] = None,
    always: int = 0,
) -> Tuple[Plan, Dict]:
    """The candidate with the smallest ``(infeasible, simulated ms, model ms, bytes)``; and ranking info.

    ``always``: the first ``always`` candidates are simulated whatever their model time (the baselines);
    ``top``: of the rest only the ``top`` best by the pipeline model are (None: all).
    """
    model = PipelineModel(p, schedule, microbatches)
    seen, pool = set(), []
    for i, (stage, devs) in enumerate(candidates):
        k = tuple(stage) + (-1,) + tuple(devs)
        if k in seen:
            continue
        seen.add(k)
        pool.append((i < always, float(f"{model.time(stage, devs):.12g}"), (list(stage), list(devs))))
    forced = [c for c in pool if c[0]]
    rest = sorted((c for c in pool if not c[0]), key=lambda c: c[1])
    if top is not None:
        rest = rest[:top]
    ranked = []
    for _, mt, (stage, devs) in forced + rest:
        plan = to_plan(stage, devs)
        infeasible = not plan.extra.get("feasible", True)
        sim = simulated_ms(p, plan, schedule, microbatches)
        ranked.append(((infeasible, float(f"{sim:.12g}"), mt, plan.comm_bytes), (stage, devs)))
    ranked.sort(key=lambda x: x[0])
    best_key, best = ranked[0]
    info = {
        "simulated_ms": best_key[1],
        "candidates_simulated": len(ranked),
        "model_best_simulated_ms": min((k for k, _ in ranked), key=lambda k: (k[0], k[2], k[3]))[1],
    }
    return best, info


def simulator_ranker(schedule: str, microbatches: int, top: Optional[int] = 12):
    """A ``rank`` callable for :func:`tf_commopt.core.partition.api.partition` backed by the simulator:
    the baseline plans and the ``top`` best others by the pipeline model are simulated."""

    def rank(p: Problem, candidates: Sequence[Plan], to_plan, n_baselines: int = 0) -> Tuple[Plan, Dict]:
        return best_simulated(p, candidates, to_plan, schedule, microbatches, top=top, always=n_baselines)

    return rank
