"""How the planner forms device groups and replica sets from device speeds.

Example:
    >>> from tf_commopt.core.planner.groups import contiguous_groups, replica_sets, snake_groups
    >>> snake_groups([1, 1, 1, 0.5], 2)
    [[0, 3], [1, 2]]
    >>> contiguous_groups([0.25, 1, 0.5, 1], 2)
    [[1, 3], [0, 2]]
    >>> replica_sets([1, 1, 0.5, 0.25], 2, "wide_first_fast")
    [[1, 2, 3], [0]]

* ``snake_groups``: devices sorted by speed (descending, ties by index) dealt to ``G`` groups in the
  order 0..G-1, G-1..0, ...: group sizes differ by at most one and their total speeds are close; each
  group keeps its devices in index order.
* ``contiguous_groups``: the speed-sorted devices cut into ``G`` consecutive blocks.
* ``replica_sets``: the devices of each stage of one pipeline with replicated stages: a grouping rule
  (``snake``, ``contiguous``), or ``wide_first_fast`` (the ``P - 1`` fastest devices one per stage
  1..P-1, all others replicate stage 0: PipeDream's "many replicas of the early layers") and
  ``wide_first_slow`` (the same with the ``P - 1`` slowest).
"""

from __future__ import annotations

from typing import List, Sequence

from tf_commopt.errors import InputError

__all__ = ["snake_groups", "contiguous_groups", "GROUPINGS", "REPLICA_SHAPES", "replica_sets"]


def _check_groups_count(n: int, num_groups: int) -> None:
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or not 1 <= num_groups <= n:
        raise InputError(
            f"num_groups must be an integer in 1..{n} (the number of devices), got {num_groups!r}",
            where="num_groups",
        )


def _by_speed(speeds: Sequence[float]) -> List[int]:
    return sorted(range(len(speeds)), key=lambda i: (-float(speeds[i]), i))


def snake_groups(speeds: Sequence[float], num_groups: int) -> List[List[int]]:
    """Devices sorted by speed dealt to ``num_groups`` groups in snake order (see the module docstring).

    >>> snake_groups([1, 0.5, 0.25, 1, 1, 0.5], 3)
    [[0, 2], [3, 5], [1, 4]]
    """
    _check_groups_count(len(speeds), num_groups)
    groups: List[List[int]] = [[] for _ in range(num_groups)]
    for k, dev in enumerate(_by_speed(speeds)):
        lap, pos = divmod(k, num_groups)
        groups[pos if lap % 2 == 0 else num_groups - 1 - pos].append(dev)
    return [sorted(g) for g in groups]


def contiguous_groups(speeds: Sequence[float], num_groups: int) -> List[List[int]]:
    """Speed-sorted devices cut into ``num_groups`` consecutive blocks (sizes differ by at most one)."""
    n = len(speeds)
    _check_groups_count(n, num_groups)
    order = _by_speed(speeds)
    q, r = divmod(n, num_groups)
    out, k = [], 0
    for g in range(num_groups):
        size = q + (1 if g < r else 0)
        out.append(sorted(order[k : k + size]))
        k += size
    return out


GROUPINGS = {"snake": snake_groups, "contiguous": contiguous_groups}
REPLICA_SHAPES = ("snake", "contiguous", "wide_first_fast", "wide_first_slow")


def replica_sets(speeds: Sequence[float], num_stages: int, shape: str) -> List[List[int]]:
    """Devices of each stage of a one-group pipeline with replicated stages (``num_stages`` sets)."""
    n = len(speeds)
    if shape in GROUPINGS:
        return GROUPINGS[shape](speeds, num_stages)
    if shape not in REPLICA_SHAPES:
        raise InputError(
            f"unknown replica shape {shape!r}; choose from {list(REPLICA_SHAPES)}", where="shape"
        )
    if not 1 <= num_stages <= n:
        raise InputError(f"num_stages must be in 1..{n}, got {num_stages}", where="num_stages")
    order = _by_speed(speeds)
    singles = order[: num_stages - 1] if shape == "wide_first_fast" else order[n - num_stages + 1 :]
    rest = sorted(set(range(n)) - set(singles))
    return [rest] + [[d] for d in singles]
