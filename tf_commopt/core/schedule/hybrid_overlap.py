"""Overlap of the grouped hybrid's all-reduces with the backward: each stage's last backward in pieces.

Example:
    >>> from tf_commopt.core.schedule.hybrid import hybrid_program
    >>> prog = hybrid_program(["a", "b"], {"a": 1.0, "b": 1.0}, [{"a": 0, "b": 0}] * 2, 1,
    ...                       overlap=True, bucket_bytes=1.0)
    >>> [(r.group, r.piece, r.nodes, r.bucket) for r in prog.roles]
    [(0, 0, ('b',), 'grads0'), (1, 0, ('b',), 'grads0'), (0, 1, ('a',), 'grads1'), (1, 1, ('a',), 'grads1')]

The rule: a stage's buckets are ordered by their ready point (the earliest node; the backward passes
it last), latest first. Piece 0 (the nodes from the bucket's ready point on) runs on the stage rank;
piece ``k >= 1`` on a *piece rank* on the same device that receives ``SendGrad(mb)`` from piece
``k-1`` (same device: free), runs ``Backward(mb)``, passes on to piece ``k+1`` (the last piece sends
the gradients to the previous stage), then all-reduces its bucket and reports ``SendAct(mb)`` to the
stage rank, which ends with one ``RecvAct(mb)`` per piece rank and ``OptimizerStep()``. Each piece
rank waits only for its own bucket, so a bucket's all-reduce runs while the next pieces compute; the
device never runs two pieces at once. Piece ranks are numbered after all stage ranks, group by group.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from tf_commopt.core.schedule.buckets import Bucket
from tf_commopt.core.schedule.hybrid_layout import Layout, RankRole
from tf_commopt.core.schedule.instructions import (
    AllReduce,
    Backward,
    OptimizerStep,
    RecvAct,
    RecvGrad,
    SendAct,
    SendGrad,
)

__all__ = ["cut_last_backward"]

Pieces = Dict[Tuple[int, int], List[Tuple[Tuple[str, ...], Optional[Bucket]]]]


def _pieces(lay: Layout) -> Pieces:
    """Per (group, stage): (nodes, bucket) of each piece, buckets by ready point, latest first."""
    pos = {v: i for i, v in enumerate(lay.order)}
    out: Pieces = {}
    for g in range(len(lay.P)):
        for s in range(lay.P[g]):
            nodes = [v for v in lay.order if lay.stage_of_node[g][v] == s]
            mine = sorted(
                (b for b in lay.buckets if b.stages[g] == s), key=lambda b: -min(pos[v] for v in b.nodes)
            )
            ps: List[Tuple[Tuple[str, ...], Optional[Bucket]]] = []
            hi = len(lay.order)
            for b in mine:
                lo = min(pos[v] for v in b.nodes)
                ps.append((tuple(v for v in nodes if lo <= pos[v] < hi), b))
                hi = lo
            rest = tuple(v for v in nodes if pos[v] < hi)
            if rest or not ps:
                ps.append((rest, None))
            out[(g, s)] = ps
    return out


def _piece_ranks(lay: Layout, pieces: Pieces) -> Dict[Tuple[int, int, int, int], int]:
    """Give piece 0 to the stage rank and a new rank to every other piece; returns (g, s, i, k) -> rank."""
    piece_rank: Dict[Tuple[int, int, int, int], int] = {}
    for g in range(len(lay.P)):
        for s in range(lay.P[g]):
            for i in lay.replicas(g, s):
                for k, (nodes, b) in enumerate(pieces[(g, s)]):
                    role = RankRole(g, s, k, nodes, b.key if b else None, i)
                    if k == 0:
                        lay.roles[lay.rank_of[(g, s, i)]] = role
                    else:
                        piece_rank[(g, s, i, k)] = len(lay.roles)
                        lay.roles.append(role)
    lay.streams += [[] for _ in range(len(lay.roles) - len(lay.streams))]
    return piece_rank


def _cut(lay: Layout, g: int, s: int, i: int, ps, piece_rank, members) -> int:
    """Rewrite the streams of replica ``i`` of stage ``s`` of group ``g``; returns its last piece's rank."""
    r = lay.rank_of[(g, s, i)]
    st = lay.streams[r]
    last = max(x for x, ins in enumerate(st) if isinstance(ins, Backward))
    mb = st[last].mb
    tail = st[last + 1 :]  # SendGrad(mb, u) for the upstream replicas
    b0 = ps[0][1]
    new = st[: last + 1]
    K = len(ps)
    if K == 1:
        lay.streams[r] = new + tail + ([AllReduce(b0.key, members[b0.key])] if b0 else []) + [OptimizerStep()]
        return r
    new += [SendGrad(mb, piece_rank[(g, s, i, 1)])]
    new += [AllReduce(b0.key, members[b0.key])] if b0 else []
    lay.streams[r] = new + [RecvAct(mb, piece_rank[(g, s, i, k)]) for k in range(1, K)] + [OptimizerStep()]
    for k in range(1, K):
        src = r if k == 1 else piece_rank[(g, s, i, k - 1)]
        hs: List = [RecvGrad(mb, src), Backward(mb)]
        hs += [SendGrad(mb, piece_rank[(g, s, i, k + 1)])] if k < K - 1 else list(tail)
        b = ps[k][1]
        if b is not None:
            hs.append(AllReduce(b.key, members[b.key]))
        hs.append(SendAct(mb, r))
        lay.streams[piece_rank[(g, s, i, k)]] = hs
    return piece_rank[(g, s, i, K - 1)]


def _last_mb(streams: Sequence[Sequence], r: int) -> int:
    """The micro-batch of stage rank ``r``'s last backward (GPipe: 0)."""
    return [ins for ins in streams[r] if isinstance(ins, Backward)][-1].mb


def cut_last_backward(lay: Layout) -> None:
    """Cut every stage rank's last backward into pieces (see the module docstring), in place."""
    pieces = _pieces(lay)
    piece_rank = _piece_ranks(lay, pieces)
    piece_of = {
        (g, s, b.key): k for (g, s), ps in pieces.items() for k, (_, b) in enumerate(ps) if b is not None
    }

    def member(h: int, s: int, j: int, key: str) -> int:
        k = piece_of[(h, s, key)]
        return lay.rank_of[(h, s, j)] if k == 0 else piece_rank[(h, s, j, k)]

    members = {
        b.key: tuple(sorted(member(h, s, j, b.key) for h, s, j in lay.holders(b))) for b in lay.buckets
    }
    last_piece: Dict[int, int] = {}  # stage rank -> the rank that sends its last backward's gradients
    for g in range(len(lay.P)):
        for s in range(lay.P[g]):
            for i in lay.replicas(g, s):
                last_piece[lay.rank_of[(g, s, i)]] = _cut(lay, g, s, i, pieces[(g, s)], piece_rank, members)
    for r, st in enumerate(lay.streams):  # upstream replicas receive from the last piece
        for x, ins in enumerate(st):
            if (
                isinstance(ins, RecvGrad)
                and ins.peer in last_piece
                and ins.peer != last_piece[ins.peer]
                and lay.roles[r].piece == 0
                and ins.mb == _last_mb(lay.streams, ins.peer)
            ):
                st[x] = RecvGrad(ins.mb, last_piece[ins.peer])
