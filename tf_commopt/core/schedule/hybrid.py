"""The grouped hybrid's program: the instruction streams of one iteration, what each rank is, and the
gradient buckets; also the batch split between groups.

Example:
    >>> from tf_commopt.core.schedule.hybrid import hybrid_program, split_batch
    >>> split_batch(10, [1.5, 2.0])
    [4, 6]
    >>> prog = hybrid_program(["a", "b"], {"a": 4e6, "b": 1e6}, [{"a": 0, "b": 1}, {"a": 0, "b": 0}],
    ...                       microbatches=2, overlap=False)
    >>> prog.schedule.compact()
    ['F0 F1 B1 B0 AR(grads1:0,2) U', 'F0 F1 B1 B0 AR(grads0:1,2) U', 'F0 F1 B1 B0 AR(grads0:1,2) AR(grads1:0,2) U']

Pipelines inside device groups, data parallel between them (HetPipe, Park et al., USENIX ATC 2020;
GPipe, Huang et al., NeurIPS 2019). The TensorFlow executor
(:class:`tf_commopt.distribute.hybrid.GroupedHybridTrainer`) runs these streams and the simulator
(:mod:`tf_commopt.core.simulate.hybrid`) binds them to costs; neither re-derives them. The rules:

* **Groups.** Group ``g`` is a GPipe pipeline of ``P_g`` stages (``stage_of_node[g]``: node -> stage);
  a stage may be replicated (data parallel inside the stage, PipeDream), its replicas taking shares
  of each micro-batch. Which groups and plans: :mod:`tf_commopt.core.planner`.
* **Batch split.** Group ``g`` gets the share ``f_g = (1/t_g) / sum_h (1/t_h)`` of the global batch,
  ``t_g`` = the time of its pipeline alone on the whole batch (:func:`batch_fractions`); integer
  samples by :func:`split_batch` (largest remainder, each >= 1).
* **Buckets** (:mod:`buckets`): bucket ``i`` is ``AllReduce("grads<i>", ranks holding it)``.
* **Streams without overlap**: each stage rank runs GPipe's stream (a replicated stage's replicas
  exchange with every overlapping neighbour replica), then the all-reduces of its buckets in bucket
  order (a global order: no deadlock), then ``OptimizerStep()``.
* **Streams with overlap** (``overlap=True``, like DDP buckets): each stage's last backward is cut
  into pieces at its buckets' ready points (:mod:`hybrid_overlap`), so a bucket's all-reduce runs
  while the next pieces compute. The TensorFlow executor runs a stage's last backward as one call and
  issues each bucket's all-reduce on its gradients, which TensorFlow starts as soon as they exist.
"""

from __future__ import annotations

from typing import List, Mapping, Optional, Sequence, Tuple

from tf_commopt.core.schedule.buckets import DEFAULT_BUCKET_BYTES, make_buckets
from tf_commopt.core.schedule.hybrid_layout import (
    HybridProgram,
    RankRole,
    build_layout,
    check_shares,
    overlap_fraction,
    stage_counts,
)
from tf_commopt.core.schedule.hybrid_overlap import cut_last_backward
from tf_commopt.core.schedule.instructions import AllReduce, OptimizerStep
from tf_commopt.errors import InputError

__all__ = [
    "check_groups",
    "split_batch",
    "batch_fractions",
    "RankRole",
    "HybridProgram",
    "hybrid_program",
    "overlap_fraction",
]


def check_groups(groups: Sequence[Sequence[int]], n: int) -> List[List[int]]:
    """``groups`` as lists of ints, or a one-line InputError unless non-empty, disjoint, in ``0..n-1``.

    >>> check_groups([(0, 2), [1]], 3)
    [[0, 2], [1]]
    """
    gs = [[int(i) for i in g] for g in groups]
    flat = [i for g in gs for i in g]
    if not gs or any(not g for g in gs) or len(flat) != len(set(flat)) or any(not 0 <= i < n for i in flat):
        raise InputError(
            f"groups must be non-empty, disjoint lists of device indices in 0..{n - 1}, got "
            f"{[list(g) for g in groups]!r}",
            where="groups",
        )
    return gs


def split_batch(batch: int, weights: Sequence[float]) -> List[int]:
    """``batch`` samples split in proportion to ``weights`` (largest remainder, each part >= 1).

    >>> split_batch(10, [1.5, 2.0])
    [4, 6]
    >>> split_batch(7, [1, 1, 1])
    [3, 2, 2]
    """
    G = len(weights)
    if G < 1 or any(not (w > 0) for w in weights):
        raise InputError(f"group weights must be positive, got {list(weights)}", where="group_weights")
    if batch < G:
        raise InputError(f"a global batch of {batch} samples cannot feed {G} groups", where="batch size")
    total = float(sum(weights))
    exact = [batch * w / total for w in weights]
    sizes = [max(1, int(e)) for e in exact]
    while sum(sizes) > batch:  # only possible through the max(1, .) floor
        i = max((j for j in range(G) if sizes[j] > 1), key=lambda j: (sizes[j] - exact[j], -j))
        sizes[i] -= 1
    rest = batch - sum(sizes)
    for i in sorted(range(G), key=lambda j: (-(exact[j] - sizes[j]), j))[:rest]:
        sizes[i] += 1
    return sizes


def batch_fractions(alone_ms: Sequence[float]) -> List[float]:
    """Each group's share of the global batch from its time alone on the whole batch: ``(1/t_g) / sum``.

    >>> [round(f, 4) for f in batch_fractions([6.0, 3.75])]
    [0.3846, 0.6154]
    """
    ts = [float(t) for t in alone_ms]
    if not ts or any(not t > 0 for t in ts):
        raise InputError(f"group times must be positive, got {ts}", where="batch_fractions")
    inv = [1.0 / t for t in ts]
    return [w / sum(inv) for w in inv]


def hybrid_program(
    order: Sequence[str],
    param_bytes: Mapping[str, float],
    stage_of_node: Sequence[Mapping[str, int]],
    microbatches: int,
    overlap: bool = True,
    bucket_bytes: Optional[float] = DEFAULT_BUCKET_BYTES,
    num_stages: Optional[Sequence[int]] = None,
    replica_shares: Optional[Sequence[Sequence[Sequence[float]]]] = None,
) -> HybridProgram:
    """The hybrid iteration's streams (see the module docstring).

    Args:
        order: every node of the model in topological order.
        param_bytes: node -> bytes of its parameters.
        stage_of_node: one mapping node -> stage per group (stages 0..P_g-1).
        microbatches: GPipe micro-batches per group.
        overlap: cut each stage's last backward into pieces whose buckets all-reduce while later pieces run.
        bucket_bytes: bucket size cap (``None``: one bucket per stage tuple).
        num_stages: P_g per group (default: 1 + the largest stage used).
        replica_shares: per group, per stage, the shares of a micro-batch its replicas take (default:
            one replica per stage). A replicated stage's buckets are all-reduced among all replicas
            of all groups.
    """
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise InputError(
            f"microbatches must be a positive integer, got {microbatches!r}", where="microbatches"
        )
    order = list(order)
    P = stage_counts(order, stage_of_node, num_stages)
    shares = check_shares(replica_shares, P)
    G = len(P)

    def keep(key: Tuple[int, ...]) -> bool:
        return sum(len(shares[h][key[h]]) for h in range(G)) > 1

    buckets = make_buckets(order, param_bytes, stage_of_node, bucket_bytes, keep=keep)
    lay = build_layout(order, stage_of_node, P, shares, buckets, microbatches)
    if overlap:
        cut_last_backward(lay)
        return lay.program("grouped_hybrid_overlap", microbatches, True)
    for r, role in enumerate(lay.roles):
        for b in buckets:
            if b.stages[role.group] == role.stage:
                ranks = tuple(sorted(lay.rank_of[x] for x in lay.holders(b)))
                lay.streams[r].append(AllReduce(b.key, ranks))
        lay.streams[r].append(OptimizerStep())
    return lay.program("grouped_hybrid", microbatches, False)
