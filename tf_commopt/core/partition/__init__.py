"""Pipeline partitioning of a CostGraph into convex stages (pure core, no TensorFlow).

Example:
    >>> from tf_commopt.core.partition import partition
    >>> from tf_commopt.core.profiles import load_profile
    >>> plan = partition(load_profile("pipedream/alexnet"), 2, method="pipedream")
    >>> plan.num_stages
    2

Modules: :mod:`objective` (the additive objective), :mod:`pipemodel` (the pipeline time of GPipe /
1F1B in closed form), :mod:`baselines` (layerwise, balanced, PipeDream DP and its tie-breaks),
:mod:`local_search` (descent on the objective), :mod:`pipesearch` (memetic descent on the pipeline
time), :mod:`evolve` and :mod:`operators` (the genetic algorithm on DEAP, for both scores),
:mod:`search` (what each method runs), :mod:`convexity` (repair), :mod:`api` (``partition``),
:mod:`synthetic` (branchy test graphs). The result is a :class:`tf_commopt.core.plan.PartitionPlan`.
This package does not import the simulator; choosing among candidates by simulation is
:mod:`tf_commopt.core.planner`.
"""

from tf_commopt.core.partition.api import METHODS, evaluate, make_cluster, partition
from tf_commopt.core.partition.objective import Evaluation, Problem
from tf_commopt.core.plan import PartitionPlan

__all__ = ["PartitionPlan", "Problem", "Evaluation", "partition", "evaluate", "make_cluster", "METHODS"]
