"""The planner: every choice of a plan is made here, above the partitioner
(:mod:`tf_commopt.core.partition`) and the simulator (:mod:`tf_commopt.core.simulate`), which do not import
each other.

Example:
    >>> from tf_commopt.core.profiles import load_profile
    >>> from tf_commopt.core.planner import partition
    >>> plan = partition(load_profile("pipedream/vgg16"), 4, bandwidth_gbps=10.0)   # ga, GPipe, M = 16
    >>> plan.method, plan.schedule, plan.microbatches, plan.cluster["bandwidth_gbps"]
    ('ga', 'gpipe', 16, 10.0)

Modules: :mod:`api` (``partition``: the plan fastest in simulation for the schedule that will run;
``given_plan``: an external assignment, e.g. PipeDream's ``stage_id``, as a plan), :mod:`simrank` (rank
candidate plans in the simulator), :mod:`groups` (device groups and replica sets), :mod:`hybrid`
(``plan_hybrid``: the grouped hybrid's plan, for the executor and the simulator alike) and
:mod:`hybrid_search` (the fastest simulated grouped hybrid).
"""

from tf_commopt.core.planner.api import given_plan, partition, read_stage_ids
from tf_commopt.core.planner.groups import (
    GROUPINGS,
    REPLICA_SHAPES,
    contiguous_groups,
    replica_sets,
    snake_groups,
)
from tf_commopt.core.planner.hybrid import group_plans, plan_hybrid, replicated_plan
from tf_commopt.core.planner.hybrid_search import HybridChoice, search_grouped_hybrid
from tf_commopt.core.planner.simrank import best_simulated, simulated_ms, simulator_ranker

__all__ = [
    "partition",
    "given_plan",
    "read_stage_ids",
    "best_simulated",
    "simulated_ms",
    "simulator_ranker",
    "snake_groups",
    "contiguous_groups",
    "GROUPINGS",
    "REPLICA_SHAPES",
    "replica_sets",
    "group_plans",
    "plan_hybrid",
    "replicated_plan",
    "HybridChoice",
    "search_grouped_hybrid",
]
