"""TensorFlow graph internals: registered op statistics, functions of a graph, control outputs of an op.

Example:
    >>> from tf_commopt._compat import op_control_outputs   # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, List, Optional

from tf_commopt._compat._gate import framework_ops


# ---- TensorFlow graph statistics (tf/op_costs.py) ------------------------------------------------------
def op_statistic(graph: Any, node_def: Any, statistic: str = "flops") -> Optional[float]:
    """TensorFlow's registered statistic (``"flops"``) of one op, or None when the op has none or needs a
    shape that is unknown."""
    try:
        return framework_ops.get_stats_for_node_def(graph, node_def, statistic).value
    except (ValueError, TypeError, KeyError):
        return None


# ---- TensorFlow graphs (tf/model_files.py, tf/train_graph.py) ---------------------------------------------
def graph_function(graph: Any, name: str) -> Optional[Any]:
    """The function ``name`` defined in ``graph`` (or an outer graph), or None."""
    return graph._get_function(name)


def op_control_outputs(op: Any) -> List[Any]:
    """The ops with a control dependency on ``op``."""
    return list(op._control_outputs)
