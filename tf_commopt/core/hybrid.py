"""The grouped hybrid, defined once: groups, batch split, gradient buckets and the instruction streams.

Example:
    >>> from tf_commopt.core.hybrid import hybrid_program, snake_groups, split_batch
    >>> snake_groups([1, 1, 1, 0.5], 2)
    [[0, 3], [1, 2]]
    >>> split_batch(10, [1.5, 2.0])
    [4, 6]
    >>> prog = hybrid_program(["a", "b"], {"a": 4e6, "b": 1e6}, [{"a": 0, "b": 1}, {"a": 0, "b": 0}],
    ...                       microbatches=2, overlap=False)
    >>> prog.schedule.compact()
    ['F0 F1 B1 B0 AR(grads1:0,2) U', 'F0 F1 B1 B0 AR(grads0:1,2) U', 'F0 F1 B1 B0 AR(grads0:1,2) AR(grads1:0,2) U']

Both the TensorFlow executor (:class:`tf_commopt.distribute.hybrid.GroupedHybridTrainer`) and the
simulator (:mod:`tf_commopt.core.simulate.hybrid`) call the functions here; neither re-derives them.
The design follows HetPipe (Park et al., USENIX ATC 2020: pipelines inside device groups, data
parallel between them), GPipe (Huang et al., NeurIPS 2019) and the bucketed gradient all-reduce of
PyTorch DDP (Li et al., VLDB 2020). The exact rules:

* **Groups.** ``snake_groups``: devices sorted by speed (descending, ties by index) dealt to ``G``
  groups in the order 0..G-1, G-1..0, ...; ``contiguous_groups``: speed-sorted blocks. Each group is a
  GPipe pipeline of ``P_g`` stages (``stage_of_node[g]``: node -> stage); ``G = N`` one-device groups
  are capacity-proportional data parallelism.
* **Batch split.** Group ``g`` gets the share ``f_g = (1/t_g) / sum_h (1/t_h)`` of the global batch,
  ``t_g`` = the time of its pipeline alone on the whole batch (:func:`batch_fractions`; the
  simulator provides ``t_g``). Integer samples: :func:`split_batch` (largest remainder, each >= 1).
* **Buckets.** Nodes with parameters are grouped by their *stage tuple* ``(stage in group 0, ...,
  stage in group G-1)``; walking the graph in reverse topological order (the order backward produces
  gradients), a tuple's nodes fill a bucket until adding one would exceed ``bucket_bytes`` (a node
  larger than that is a bucket alone; ``None``: one bucket per tuple). Bucket ``i`` is
  ``AllReduce("grads<i>", ranks holding it)``, one rank per group; buckets are numbered by their
  latest node in topological order, latest first. With ``G = 1`` there is nothing to reduce.
* **Streams without overlap** (``overlap=False``): each stage rank runs GPipe's stream (``gpipe(P_g, M)``
  without its step; a replicated stage's replicas exchange with every overlapping neighbour replica), then the all-reduces of its buckets in bucket order (a global order: no deadlock), then
  ``OptimizerStep()``.
* **Streams with overlap** (``overlap=True``, like DDP buckets / Horovod tensor fusion): the stage's
  last backward (micro-batch 0 in GPipe) is cut into *pieces* at its buckets' ready points (a bucket
  is ready when the backward has passed its earliest node); piece 0 runs on the stage rank, piece
  ``k >= 1`` on a *piece rank* on the same device that receives ``SendGrad(0)`` from piece ``k-1``
  (same device: free), runs ``Backward(0)``, passes on to piece ``k+1`` (the last piece sends the
  gradients to the previous stage), then all-reduces its bucket and reports ``SendAct(0)`` to the
  stage rank, which ends with one ``RecvAct(0)`` per piece rank and ``OptimizerStep()``. Each piece
  rank waits only for its own bucket, so a bucket's all-reduce runs while the next pieces compute;
  the device never runs two pieces at once (each starts when the previous one has ended). Piece ranks
  are numbered after all stage ranks, group by group. The TensorFlow executor runs a stage's last
  backward as one call (piece ranks' ``Backward`` are its parts) and issues each bucket's all-reduce
  on its gradients, which TensorFlow starts as soon as they exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from tf_commopt.core.schedule import (
    AllReduce,
    Backward,
    Forward,
    OptimizerStep,
    RecvAct,
    RecvGrad,
    Schedule,
    SendAct,
    SendGrad,
)
from tf_commopt.errors import InputError, PlanError

__all__ = [
    "snake_groups",
    "contiguous_groups",
    "GROUPINGS",
    "check_groups",
    "split_batch",
    "batch_fractions",
    "Bucket",
    "RankRole",
    "HybridProgram",
    "make_buckets",
    "hybrid_program",
    "DEFAULT_BUCKET_BYTES",
    "overlap_fraction",
]

DEFAULT_BUCKET_BYTES = 25e6  # PyTorch DDP's default bucket_cap_mb = 25


# ----------------------------------------------------------------------------- groups and split
def _check_groups_count(n: int, num_groups: int) -> None:
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or not 1 <= num_groups <= n:
        raise InputError(
            f"num_groups must be an integer in 1..{n} (the number of devices), got {num_groups!r}",
            where="num_groups",
        )


def snake_groups(speeds: Sequence[float], num_groups: int) -> List[List[int]]:
    """Devices sorted by speed (descending, ties by index) dealt in snake order; each group sorted.

    >>> snake_groups([1, 1, 1, 0.5], 2)
    [[0, 3], [1, 2]]
    """
    n = len(speeds)
    _check_groups_count(n, num_groups)
    order = sorted(range(n), key=lambda i: (-float(speeds[i]), i))
    groups: List[List[int]] = [[] for _ in range(num_groups)]
    for k, dev in enumerate(order):
        lap, pos = divmod(k, num_groups)
        groups[pos if lap % 2 == 0 else num_groups - 1 - pos].append(dev)
    return [sorted(g) for g in groups]


def contiguous_groups(speeds: Sequence[float], num_groups: int) -> List[List[int]]:
    """Speed-sorted devices cut into ``num_groups`` consecutive blocks (sizes differ by at most one).

    >>> contiguous_groups([0.25, 1, 0.5, 1], 2)
    [[1, 3], [0, 2]]
    """
    n = len(speeds)
    _check_groups_count(n, num_groups)
    order = sorted(range(n), key=lambda i: (-float(speeds[i]), i))
    q, r = divmod(n, num_groups)
    out, k = [], 0
    for g in range(num_groups):
        size = q + (1 if g < r else 0)
        out.append(sorted(order[k : k + size]))
        k += size
    return out


GROUPINGS = {"snake": snake_groups, "contiguous": contiguous_groups}


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


# ----------------------------------------------------------------------------- buckets
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
    """The gradient buckets (see module docstring); ``keep(stage tuple)`` says whether a tuple is held by
    more than one rank (default: more than one group).

    Args:
        order: every node in topological order.
        param_bytes: bytes of each node's parameters (missing: 0).
        stage_of_node: per group, node -> stage.
        bucket_bytes: bucket size cap (``None``: one bucket per stage tuple).

    >>> [(b.key, b.stages, b.nodes) for b in make_buckets(["a", "b", "c"], {"a": 1, "b": 1, "c": 1},
    ...                                                   [{"a": 0, "b": 0, "c": 1}] * 2, bucket_bytes=1.5)]
    [('grads0', (1, 1), ('c',)), ('grads1', (0, 0), ('b',)), ('grads2', (0, 0), ('a',))]
    """
    if bucket_bytes is not None and not bucket_bytes > 0:
        raise InputError(f"bucket_bytes must be positive or None, got {bucket_bytes!r}", where="bucket_bytes")
    if keep is None:
        keep = lambda key: len(stage_of_node) > 1  # noqa: E731
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


# ----------------------------------------------------------------------------- the program
@dataclass(frozen=True)
class RankRole:
    """What rank ``r`` of a :class:`HybridProgram` is: replica ``replica`` of stage ``stage`` of group
    ``group``; ``piece`` 0 is the stage rank, ``piece >= 1`` a piece rank of its last backward.
    ``nodes``: the nodes whose last backward this rank runs (the whole stage for a stage rank without
    pieces); ``bucket``: the key it all-reduces in its overlap piece (``None`` if none)."""

    group: int
    stage: int
    piece: int
    nodes: Tuple[str, ...]
    bucket: Optional[str]
    replica: int = 0


@dataclass(frozen=True)
class HybridProgram:
    """The instruction streams of one hybrid iteration, what each rank is, and the buckets.

    ``stage_rank[g][s]``: the rank of replica 0 of stage s of group g; ``replica_ranks[g][s]``: all its
    replicas' ranks; ``shares[g][s]``: each replica's share of a micro-batch (intervals of [0, 1) in
    replica order: replica i of stage s sends micro-batch activations to replica j of stage s + 1 for
    the overlap of their intervals)."""

    schedule: Schedule
    roles: Tuple[RankRole, ...]
    buckets: Tuple[Bucket, ...]
    stage_rank: Tuple[Tuple[int, ...], ...]
    overlap: bool
    replica_ranks: Tuple[Tuple[Tuple[int, ...], ...], ...] = ()
    shares: Tuple[Tuple[Tuple[float, ...], ...], ...] = ()

    def bucket(self, key: str) -> Bucket:
        for b in self.buckets:
            if b.key == key:
                return b
        raise KeyError(key)


def _num_stages(son: Mapping[str, int], g: int, p: Optional[int]) -> int:
    stages = sorted(set(int(s) for s in son.values()))
    if p is None:
        p = len(stages)
    if not stages or stages[0] < 0 or stages[-1] >= p:
        raise PlanError(f"group {g}'s stages must lie in 0..{p - 1}, got {stages}", where="hybrid plan")
    return p


_EPS = 1e-12


def overlap_fraction(a: Sequence[float], i: int, b: Sequence[float], j: int) -> float:
    """Length of the overlap of replica ``i``'s interval under shares ``a`` and replica ``j``'s under ``b``.

    >>> overlap_fraction([0.5, 0.5], 1, [0.25, 0.75], 1)
    0.5
    """
    lo_a, lo_b = sum(a[:i]), sum(b[:j])
    return max(0.0, min(lo_a + a[i], lo_b + b[j]) - max(lo_a, lo_b))


def _check_shares(
    replica_shares: Optional[Sequence[Sequence[Sequence[float]]]], P: Sequence[int]
) -> List[List[Tuple[float, ...]]]:
    if replica_shares is None:
        return [[(1.0,)] * p for p in P]
    if len(replica_shares) != len(P):
        raise InputError(
            f"replica_shares has {len(replica_shares)} groups, expected {len(P)}", where="replica_shares"
        )
    out = []
    for g, (sh, p) in enumerate(zip(replica_shares, P)):
        if len(sh) != p:
            raise InputError(
                f"group {g}: {len(sh)} stages of replica shares for {p} stages", where="replica_shares"
            )
        row = []
        for s, fr in enumerate(sh):
            fr = tuple(float(x) for x in fr)
            if not fr or any(not x > 0 for x in fr) or abs(sum(fr) - 1.0) > 1e-9:
                raise InputError(
                    f"group {g} stage {s}: replica shares must be positive and sum to 1, got {list(fr)}",
                    where="replica_shares",
                )
            row.append(fr)
        out.append(row)
    return out


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
    """The hybrid iteration's streams (see module docstring).

    Args:
        order: every node of the model in topological order.
        param_bytes: node -> bytes of its parameters.
        stage_of_node: one mapping node -> stage per group (stages 0..P_g-1).
        microbatches: GPipe micro-batches per group.
        overlap: cut each stage's last backward into pieces whose buckets all-reduce while later pieces run.
        bucket_bytes: bucket size cap (``None``: one bucket per stage tuple).
        num_stages: P_g per group (default: 1 + the largest stage used).
        replica_shares: per group, per stage, the shares of a micro-batch its replicas take (default:
            one replica per stage). A replicated stage is data parallel inside the stage (PipeDream):
            its replicas' streams are GPipe's with one receive/send per overlapping replica of the
            neighbouring stage, and its buckets are all-reduced among all replicas of all groups.
    """
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise InputError(
            f"microbatches must be a positive integer, got {microbatches!r}", where="microbatches"
        )
    if not stage_of_node:
        raise InputError("no groups", where="hybrid_program")
    order = list(order)
    for g, son in enumerate(stage_of_node):
        missing = [v for v in order if v not in son]
        if missing:
            raise PlanError(f"node {missing[0]!r} has no stage in group {g}'s plan", where="hybrid plan")
    if num_stages is not None and len(num_stages) != len(stage_of_node):
        raise InputError(
            f"{len(num_stages)} stage counts for {len(stage_of_node)} groups", where="num_stages"
        )
    P = [
        _num_stages({v: son[v] for v in order}, g, None if num_stages is None else int(num_stages[g]))
        for g, son in enumerate(stage_of_node)
    ]
    shares = _check_shares(replica_shares, P)
    G, M = len(P), microbatches
    buckets = make_buckets(
        order,
        param_bytes,
        stage_of_node,
        bucket_bytes,
        keep=lambda key: sum(len(shares[h][key[h]]) for h in range(G)) > 1,
    )
    pos = {v: i for i, v in enumerate(order)}

    # stage ranks: group by group, stage by stage, replica by replica
    rank_of: Dict[Tuple[int, int, int], int] = {}
    roles: List[RankRole] = []
    for g in range(G):
        for s in range(P[g]):
            nodes = tuple(v for v in order if stage_of_node[g][v] == s)
            for i in range(len(shares[g][s])):
                rank_of[(g, s, i)] = len(roles)
                roles.append(RankRole(g, s, 0, nodes, None, i))

    def peers(g: int, s: int, i: int, t: int) -> List[int]:
        if not 0 <= t < P[g]:
            return []
        return [
            rank_of[(g, t, j)]
            for j in range(len(shares[g][t]))
            if overlap_fraction(shares[g][s], i, shares[g][t], j) > _EPS
        ]

    streams: List[List] = []
    for g in range(G):
        for s in range(P[g]):
            for i in range(len(shares[g][s])):
                up, down = peers(g, s, i, s - 1), peers(g, s, i, s + 1)
                st: List = []
                for m in range(M):
                    st += [RecvAct(m, u) for u in up] + [Forward(m)] + [SendAct(m, d) for d in down]
                for m in reversed(range(M)):
                    st += [RecvGrad(m, d) for d in down] + [Backward(m)] + [SendGrad(m, u) for u in up]
                streams.append(st)

    def holders(b: Bucket) -> List[Tuple[int, int, int]]:
        return [(h, b.stages[h], j) for h in range(G) for j in range(len(shares[h][b.stages[h]]))]

    stage_rank = tuple(tuple(rank_of[(g, s, 0)] for s in range(P[g])) for g in range(G))
    replica_ranks = tuple(
        tuple(tuple(rank_of[(g, s, i)] for i in range(len(shares[g][s]))) for s in range(P[g]))
        for g in range(G)
    )
    shares_t = tuple(tuple(sh) for sh in shares)
    if not overlap:
        for r, role in enumerate(roles):
            mine = [b for b in buckets if b.stages[role.group] == role.stage]
            streams[r] += [AllReduce(b.key, tuple(sorted(rank_of[x] for x in holders(b)))) for b in mine]
            streams[r].append(OptimizerStep())
        sched = Schedule("grouped_hybrid", M, tuple(tuple(x) for x in streams), microbatches_per_minibatch=M)
        return HybridProgram(sched, tuple(roles), tuple(buckets), stage_rank, False, replica_ranks, shares_t)

    # pieces: per (group, stage), buckets by ready point (earliest node), latest first
    pieces: Dict[Tuple[int, int], List[Tuple[Tuple[str, ...], Optional[Bucket]]]] = {}
    for g in range(G):
        for s in range(P[g]):
            nodes = [v for v in order if stage_of_node[g][v] == s]
            mine = sorted(
                (b for b in buckets if b.stages[g] == s), key=lambda b: -min(pos[v] for v in b.nodes)
            )
            out: List[Tuple[Tuple[str, ...], Optional[Bucket]]] = []
            hi = len(order)
            for b in mine:
                lo = min(pos[v] for v in b.nodes)
                out.append((tuple(v for v in nodes if lo <= pos[v] < hi), b))
                hi = lo
            rest = tuple(v for v in nodes if pos[v] < hi)
            if rest or not out:
                out.append((rest, None))
            pieces[(g, s)] = out
    piece_rank: Dict[Tuple[int, int, int, int], int] = {}
    for g in range(G):  # piece ranks after all stage ranks, group by group
        for s in range(P[g]):
            for i in range(len(shares[g][s])):
                for k, (nodes, b) in enumerate(pieces[(g, s)]):
                    if k == 0:
                        r = rank_of[(g, s, i)]
                        roles[r] = RankRole(g, s, 0, nodes, b.key if b else None, i)
                    else:
                        piece_rank[(g, s, i, k)] = len(roles)
                        roles.append(RankRole(g, s, k, nodes, b.key if b else None, i))
    piece_of = {
        (g, s, b.key): k for (g, s), ps in pieces.items() for k, (_, b) in enumerate(ps) if b is not None
    }

    def member(h: int, s: int, j: int, key: str) -> int:
        k = piece_of[(h, s, key)]
        return rank_of[(h, s, j)] if k == 0 else piece_rank[(h, s, j, k)]

    members = {b.key: tuple(sorted(member(h, s, j, b.key) for h, s, j in holders(b))) for b in buckets}
    streams += [[] for _ in range(len(roles) - len(streams))]
    last_piece: Dict[int, int] = {}  # stage rank -> the rank that sends its last backward's gradients
    for g in range(G):
        for s in range(P[g]):
            ps = pieces[(g, s)]
            K = len(ps)
            for i in range(len(shares[g][s])):
                r = rank_of[(g, s, i)]
                st = streams[r]
                last = max(x for x, ins in enumerate(st) if isinstance(ins, Backward))
                mb = st[last].mb
                tail = st[last + 1 :]  # SendGrad(mb, u) for the upstream replicas
                b0 = ps[0][1]
                new = st[: last + 1]
                if K == 1:
                    new += tail + ([AllReduce(b0.key, members[b0.key])] if b0 else []) + [OptimizerStep()]
                    last_piece[r] = r
                else:
                    new += [SendGrad(mb, piece_rank[(g, s, i, 1)])]
                    new += [AllReduce(b0.key, members[b0.key])] if b0 else []
                    new += [RecvAct(mb, piece_rank[(g, s, i, k)]) for k in range(1, K)] + [OptimizerStep()]
                    for k in range(1, K):
                        h = piece_rank[(g, s, i, k)]
                        src = r if k == 1 else piece_rank[(g, s, i, k - 1)]
                        hs: List = [RecvGrad(mb, src), Backward(mb)]
                        hs += [SendGrad(mb, piece_rank[(g, s, i, k + 1)])] if k < K - 1 else list(tail)
                        b = ps[k][1]
                        if b is not None:
                            hs.append(AllReduce(b.key, members[b.key]))
                        hs.append(SendAct(mb, r))
                        streams[h] = hs
                    last_piece[r] = piece_rank[(g, s, i, K - 1)]
                streams[r] = new
    for r, st in enumerate(
        streams
    ):  # upstream replicas receive the last backward's gradients from the last piece
        for x, ins in enumerate(st):
            if (
                isinstance(ins, RecvGrad)
                and ins.peer in last_piece
                and ins.peer != last_piece[ins.peer]
                and roles[r].piece == 0
                and ins.mb == _last_mb(streams, ins.peer)
            ):
                st[x] = RecvGrad(ins.mb, last_piece[ins.peer])
    sched = Schedule(
        "grouped_hybrid_overlap", M, tuple(tuple(x) for x in streams), microbatches_per_minibatch=M
    )
    return HybridProgram(sched, tuple(roles), tuple(buckets), stage_rank, True, replica_ranks, shares_t)


def _last_mb(streams: Sequence[Sequence], r: int) -> int:
    """The micro-batch of stage rank ``r``'s last backward (GPipe: 0)."""
    return [ins for ins in streams[r] if isinstance(ins, Backward)][-1].mb
