"""Pipeline partitioning of a CostGraph into stages (pure core).

See :mod:`tf_commopt.core.partition.plan` for the result value.
"""
from tf_commopt.core.partition.plan import PartitionPlan

__all__ = ["PartitionPlan"]
