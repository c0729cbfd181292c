"""Pipeline partitioning of a CostGraph into convex stages (pure core, no TensorFlow).

Example:
    >>> from tf_commopt.core.partition import partition
    >>> from tf_commopt.core.profiles import load_profile
    >>> plan = partition(load_profile("pipedream/alexnet"), 2, method="pipedream")
    >>> plan.num_stages
    2

Modules: :mod:`objective` (the one cost model), :mod:`baselines` (layerwise, balanced, PipeDream DP),
:mod:`local_search`, :mod:`genetic` (DEAP), :mod:`convexity` (repair), :mod:`api` (``partition``),
:mod:`plan` (the result value), :mod:`synthetic` (branchy test graphs).
"""
from tf_commopt.core.partition.plan import PartitionPlan
from tf_commopt.core.partition.objective import Evaluation, Problem
from tf_commopt.core.partition.api import METHODS, evaluate, make_cluster, partition

__all__ = ["PartitionPlan", "Problem", "Evaluation", "partition", "evaluate", "make_cluster", "METHODS"]
