import math

import pytest

from tf_commopt.core import CostGraph, Node
from tf_commopt.errors import GraphError


def _g(edges, n=3):
    return CostGraph([Node(c, 1.0, 2.0) for c in "abcdefgh"[:n]], edges)


def test_topological_order_is_deterministic_and_respects_edges():
    g = CostGraph([Node("c", 1, 1), Node("a", 1, 1), Node("b", 1, 1)], [("a", "b"), ("c", "b")])
    assert g.topological_order() == ["c", "a", "b"]
    assert g.predecessors("b") == ["a", "c"]


@pytest.mark.parametrize(
    "nodes,edges,match",
    [
        ([], [], "empty graph"),
        ([Node("a", 1, 1), Node("a", 1, 1)], [], "duplicate node name 'a'"),
        ([Node("a", -1, 1)], [], "node 'a': forward_ms is negative"),
        ([Node("a", 1, math.nan)], [], "backward_ms is not finite"),
        ([Node("a", 1, 1, activation_bytes="x")], [], "activation_bytes is not a number"),
        ([Node("a", 1, 1)], [("a", "zz")], "edge 'a' -> 'zz': unknown node 'zz'"),
        ([Node("a", 1, 1)], [("a", "a")], "self loop"),
        ([Node("a", 1, 1), Node("b", 1, 1)], [("a", "b"), ("b", "a")], "cycle"),
    ],
)
def test_validation_errors_name_the_culprit(nodes, edges, match):
    with pytest.raises(GraphError, match=match):
        CostGraph(nodes, edges)


def test_kind_costs():
    g = _g([("a", "b"), ("b", "c")])
    g.add_kind("bf16", {"a": (0.5, 1.0), "b": (1.0, 2.0), "c": (1.0, 2.0)})
    assert g.compute_ms("a", "bf16") == 1.5
    assert g.compute_ms("a") == 3.0
    assert g.total_ms("bf16") == 7.5
    with pytest.raises(GraphError, match="lacks costs"):
        g.add_kind("x", {"a": (1, 1)})
    with pytest.raises(GraphError, match="unknown device kind"):
        g.compute_ms("a", "fp8")
