"""Synthetic branchy cost graphs (NASNet-like cells) for tests and benchmarks of the partitioner.

Example:
    >>> from tf_commopt.core.partition.synthetic import branchy_graph
    >>> g = branchy_graph(300, seed=1)
    >>> 300 <= len(g) <= 300 + 4 * 5 + 2        # whole cells: up to one cell more
    True

Each *cell* reads the outputs of the previous two cells (the NASNet-A skip pattern), runs ``branches``
parallel chains of 2-4 ops (conv-like: heavy compute, pooling/activation-like: light), and ends in a
concatenation; every few cells a reduction halves the activation size. Costs are drawn from a seeded
``random.Random`` so a seed always gives the same graph.
"""

from __future__ import annotations

import random

from tf_commopt.core.costgraph import CostGraph, Node

__all__ = ["branchy_graph"]


def branchy_graph(num_nodes: int = 2700, seed: int = 0, branches: int = 5, act_mb: float = 8.0) -> CostGraph:
    """A NASNet-like DAG of about ``num_nodes`` nodes."""
    rng = random.Random(seed)
    nodes, edges = [Node("input", 0.0, 0.0, activation_bytes=act_mb * 1e6 / 4, label="Input")], []
    prev2, prev1 = "input", "input"
    act = act_mb * 1e6
    cell = 0
    while len(nodes) < num_nodes - 2:
        cell += 1
        if cell % 6 == 0:
            act /= 2.0
        outs = []
        for b in range(branches):
            src = prev1 if b % 2 == 0 else prev2
            for j in range(rng.randint(2, 4)):
                name = f"c{cell}_b{b}_{j}"
                heavy = rng.random() < 0.5
                f = rng.uniform(0.3, 1.5) if heavy else rng.uniform(0.02, 0.2)
                nodes.append(
                    Node(
                        name,
                        f,
                        f * rng.uniform(1.5, 2.5),
                        param_bytes=rng.uniform(1e4, 2e6) if heavy else 0.0,
                        activation_bytes=act * rng.choice([0.5, 1.0]),
                        label="Conv" if heavy else "Relu",
                    )
                )
                edges.append((src, name))
                src = name
            outs.append(src)
        cat = f"c{cell}_concat"
        nodes.append(Node(cat, 0.01, 0.01, activation_bytes=act * 2, label="Concat"))
        edges.extend((o, cat) for o in outs)
        prev2, prev1 = prev1, cat
    nodes.append(Node("head", 0.5, 1.0, param_bytes=4e6, activation_bytes=1e4, label="Dense"))
    edges.append((prev1, "head"))
    return CostGraph(nodes, edges, name=f"branchy{num_nodes}")
