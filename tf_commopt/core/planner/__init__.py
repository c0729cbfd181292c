"""The planner: the layer above the partitioner (:mod:`tf_commopt.core.partition`) and the simulator
(:mod:`tf_commopt.core.simulate`). Neither of those imports the other; what needs both lives here.

Example:
    >>> from tf_commopt.core.profiles import load_profile
    >>> from tf_commopt.core.planner import partition
    >>> plan = partition(load_profile("pipedream/vgg16"), 4, bandwidth_gbps=10.0)   # ga, GPipe, M = 16
    >>> plan.method, plan.schedule, plan.microbatches, plan.cluster["bandwidth_gbps"]
    ('ga', 'gpipe', 16, 10.0)

Modules: :mod:`simrank` (rank candidate plans in the simulator; moved from ``core.partition.simrank``),
:mod:`api` (``partition`` whose default returns the plan fastest in simulation for the schedule that
will run; ``given_plan``: load an external assignment, e.g. PipeDream's ``stage_id``, as a plan).
"""

from tf_commopt.core.planner.api import given_plan, partition, read_stage_ids
from tf_commopt.core.planner.simrank import best_simulated, simulated_ms, simulator_ranker

__all__ = ["partition", "given_plan", "read_stage_ids", "best_simulated", "simulated_ms", "simulator_ranker"]
