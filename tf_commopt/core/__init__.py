"""The pure core: cost graphs, devices, partitioning, schedules, simulation, interval policies.

Nothing under ``tf_commopt.core`` imports TensorFlow (a test checks it), so this layer is fast
to import and test.

Example:
    >>> from tf_commopt.core import CostGraph, Node
    >>> CostGraph([Node("x", 1.0, 1.0)], []).topological_order()
    ['x']
"""

from tf_commopt.core.costgraph import CostGraph, Node

__all__ = ["CostGraph", "Node"]
