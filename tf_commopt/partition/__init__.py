"""Public partitioner API (pure: no TensorFlow). CLI: ``python -m tf_commopt.partition``.

Example:
    >>> from tf_commopt.partition import partition, load_profile
    >>> plan = partition(load_profile("pipedream/vgg16"), 4, method="ga", bandwidth_gbps=10.0, seed=0)
    >>> plan.method, plan.num_stages, plan.schedule, plan.extra["score"]
    ('ga', 4, 'gpipe', 'simulated')

``partition`` is the planner's (:func:`tf_commopt.core.planner.partition`): by default it returns the
plan fastest in simulation for the schedule given (GPipe, ``4 K`` micro-batches unless told otherwise).
``given_plan`` loads an external assignment (e.g. PipeDream's ``stage_id``) as a plan.
See docs/partitioning.md for the objective, the pipeline model and the methods.
"""

from tf_commopt.core.partition import METHODS, PartitionPlan, evaluate, make_cluster
from tf_commopt.core.planner import given_plan, partition, read_stage_ids
from tf_commopt.core.profiles import (
    bundled_profile_path,
    load_profile,
    read_json,
    read_pipedream,
    write_json,
    write_pipedream,
)

__all__ = [
    "partition",
    "given_plan",
    "read_stage_ids",
    "evaluate",
    "make_cluster",
    "METHODS",
    "PartitionPlan",
    "load_profile",
    "bundled_profile_path",
    "read_json",
    "read_pipedream",
    "write_json",
    "write_pipedream",
]
