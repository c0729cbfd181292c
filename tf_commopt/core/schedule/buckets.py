"""Gradient buckets of the grouped hybrid: which nodes' gradients are all-reduced together.

Example:
    >>> from tf_commopt.core.schedule.buckets import make_buckets
    >>> [(b.key, b.stages, b.nodes) for b in make_buckets(["a", "b", "c"], {"a": 1, "b": 1, "c": 1},
    ...                                                   [{"a": 0, "b": 0, "c": 1}] * 2, bucket_bytes=1.5)]
    [('grads0', (1, 1), ('c',)), ('grads1', (0, 0), ('b',)), ('grads2', (0, 0), ('a',))]

The rule (the bucketed all-reduce of PyTorch DDP, Li et al., VLDB 2020): nodes with parameters are
grouped by their *stage tuple* ``(stage in group 0, ..., stage in group G-1)``; walking the graph in
reverse topological order (the order backward produces gradients), a tuple's nodes fill a bucket until
adding one would exceed ``bucket_bytes`` (a node larger than that is a bucket alone; ``None``: one
bucket per tuple). Buckets are numbered by their latest node in topological order, latest first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from tf_commopt.errors import InputError, PlanError

__all__ = ["Bucket", "make_buckets", "DEFAULT_BUCKET_BYTES"]

DEFAULT_BUCKET_BYTES = 25e6  # PyTorch DDP's default bucket_cap_mb = 25


@dataclass(frozen=True)
class Bucket:
    """One gradient all-reduce: ``key``, the stage holding it in each group, its nodes, its bytes."""

    key: str
    stages: Tuple[int, ...]
    nodes: Tuple[str, ...]
    nbytes: float


def make_buckets(
    order: Sequence[str],
    param_bytes: Mapping[str, float],
    stage_of_node: Sequence[Mapping[str, int]],
    bucket_bytes: Optional[float] = DEFAULT_BUCKET_BYTES,
    keep: Optional[Callable[[Tuple[int, ...]], bool]] = None,
) -> List[Bucket]:
    """The gradient buckets (see the module docstring).

    Args:
        order: every node in topological order.
        param_bytes: bytes of each node's parameters (missing: 0).
        stage_of_node: per group, node -> stage.
        bucket_bytes: bucket size cap (``None``: one bucket per stage tuple).
        keep: ``keep(stage tuple)`` says whether a tuple is held by more than one rank, i.e. needs an
            all-reduce (default: more than one group).
    """
    if bucket_bytes is not None and not bucket_bytes > 0:
        raise InputError(f"bucket_bytes must be positive or None, got {bucket_bytes!r}", where="bucket_bytes")
    if keep is None:

        def keep(key: Tuple[int, ...]) -> bool:
            return len(stage_of_node) > 1

    open_: Dict[Tuple[int, ...], List[str]] = {}
    size: Dict[Tuple[int, ...], float] = {}
    closed: List[Tuple[int, Tuple[int, ...], List[str]]] = []  # (latest topo index, tuple, nodes)
    first: Dict[Tuple[int, ...], int] = {}
    pos = {v: i for i, v in enumerate(order)}
    for v in reversed(list(order)):
        b = float(param_bytes.get(v, 0.0))
        if not b > 0:
            continue
        try:
            key = tuple(int(son[v]) for son in stage_of_node)
        except KeyError:
            raise PlanError(f"node {v!r} has no stage in some group's plan", where="hybrid buckets") from None
        if key in open_ and bucket_bytes is not None and size[key] + b > bucket_bytes:
            closed.append((first[key], key, open_.pop(key)))
        if key not in open_:
            open_[key], size[key], first[key] = [], 0.0, pos[v]
        open_[key].append(v)
        size[key] += b
    closed += [(first[k], k, nodes) for k, nodes in open_.items()]
    closed = [c for c in closed if keep(c[1])]
    closed.sort(key=lambda t: (-t[0], t[1]))
    return [
        Bucket(f"grads{i}", key, tuple(nodes), float(sum(param_bytes[v] for v in nodes)))
        for i, (_, key, nodes) in enumerate(closed)
    ]
