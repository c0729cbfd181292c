"""The grouped hybrid's ranks and GPipe streams, before the all-reduces: what :mod:`hybrid` builds on.

Example:
    >>> from tf_commopt.core.schedule.hybrid_layout import build_layout
    >>> lay = build_layout(["a", "b"], [{"a": 0, "b": 1}], [2], [[(1.0,), (1.0,)]], [], 1)
    >>> [(r.group, r.stage, r.replica) for r in lay.roles], [len(st) for st in lay.streams]
    ([(0, 0, 0), (0, 1, 0)], [4, 4])

Stage ranks are numbered group by group, stage by stage, replica by replica; each runs GPipe's stream,
a replicated stage's replicas exchanging with every overlapping replica of the neighbouring stages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from tf_commopt.core.schedule.base import Schedule
from tf_commopt.core.schedule.buckets import Bucket
from tf_commopt.core.schedule.instructions import Backward, Forward, RecvAct, RecvGrad, SendAct, SendGrad
from tf_commopt.errors import InputError, PlanError

__all__ = [
    "RankRole",
    "HybridProgram",
    "Layout",
    "build_layout",
    "overlap_fraction",
    "check_shares",
    "stage_counts",
]

_EPS = 1e-12


def overlap_fraction(a: Sequence[float], i: int, b: Sequence[float], j: int) -> float:
    """Length of the overlap of replica ``i``'s interval under shares ``a`` and replica ``j``'s under ``b``.

    >>> overlap_fraction([0.5, 0.5], 1, [0.25, 0.75], 1)
    0.5
    """
    lo_a, lo_b = sum(a[:i]), sum(b[:j])
    return max(0.0, min(lo_a + a[i], lo_b + b[j]) - max(lo_a, lo_b))


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


@dataclass
class Layout:
    """The program under construction: groups' stage counts, replica shares, stage ranks and streams."""

    order: List[str]
    stage_of_node: Sequence[Mapping[str, int]]
    P: List[int]
    shares: List[List[Tuple[float, ...]]]
    buckets: List[Bucket]
    rank_of: Dict[Tuple[int, int, int], int]
    roles: List[RankRole]
    streams: List[List]

    def replicas(self, g: int, s: int) -> range:
        return range(len(self.shares[g][s]))

    def peers(self, g: int, s: int, i: int, t: int) -> List[int]:
        """Ranks of the replicas of stage ``t`` whose share overlaps replica ``i`` of stage ``s``."""
        if not 0 <= t < self.P[g]:
            return []
        return [
            self.rank_of[(g, t, j)]
            for j in self.replicas(g, t)
            if overlap_fraction(self.shares[g][s], i, self.shares[g][t], j) > _EPS
        ]

    def holders(self, b: Bucket) -> List[Tuple[int, int, int]]:
        """(group, stage, replica) of every rank holding bucket ``b``."""
        return [(h, b.stages[h], j) for h in range(len(self.P)) for j in self.replicas(h, b.stages[h])]

    def program(self, name: str, M: int, overlap: bool) -> HybridProgram:
        G = len(self.P)
        stage_rank = tuple(tuple(self.rank_of[(g, s, 0)] for s in range(self.P[g])) for g in range(G))
        replica_ranks = tuple(
            tuple(tuple(self.rank_of[(g, s, i)] for i in self.replicas(g, s)) for s in range(self.P[g]))
            for g in range(G)
        )
        sched = Schedule(name, M, tuple(tuple(x) for x in self.streams), microbatches_per_minibatch=M)
        shares = tuple(tuple(sh) for sh in self.shares)
        return HybridProgram(
            sched, tuple(self.roles), tuple(self.buckets), stage_rank, overlap, replica_ranks, shares
        )


def _num_stages(son: Mapping[str, int], g: int, p: Optional[int]) -> int:
    stages = sorted(set(int(s) for s in son.values()))
    if p is None:
        p = len(stages)
    if not stages or stages[0] < 0 or stages[-1] >= p:
        raise PlanError(f"group {g}'s stages must lie in 0..{p - 1}, got {stages}", where="hybrid plan")
    return p


def check_shares(
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


def stage_counts(
    order: List[str], stage_of_node: Sequence[Mapping[str, int]], num_stages: Optional[Sequence[int]]
) -> List[int]:
    if not stage_of_node:
        raise InputError("no groups", where="hybrid_program")
    for g, son in enumerate(stage_of_node):
        missing = [v for v in order if v not in son]
        if missing:
            raise PlanError(f"node {missing[0]!r} has no stage in group {g}'s plan", where="hybrid plan")
    if num_stages is not None and len(num_stages) != len(stage_of_node):
        raise InputError(
            f"{len(num_stages)} stage counts for {len(stage_of_node)} groups", where="num_stages"
        )
    return [
        _num_stages({v: son[v] for v in order}, g, None if num_stages is None else int(num_stages[g]))
        for g, son in enumerate(stage_of_node)
    ]


def build_layout(
    order: List[str],
    stage_of_node: Sequence[Mapping[str, int]],
    P: List[int],
    shares: List[List[Tuple[float, ...]]],
    buckets: List[Bucket],
    M: int,
) -> Layout:
    """Stage ranks and their GPipe streams for groups of ``P`` stages with replica ``shares``."""
    lay = Layout(order, stage_of_node, P, shares, buckets, {}, [], [])
    for g in range(len(P)):
        for s in range(P[g]):
            nodes = tuple(v for v in order if stage_of_node[g][v] == s)
            for i in lay.replicas(g, s):
                lay.rank_of[(g, s, i)] = len(lay.roles)
                lay.roles.append(RankRole(g, s, 0, nodes, None, i))
    for g in range(len(P)):
        for s in range(P[g]):
            for i in lay.replicas(g, s):
                up, down = lay.peers(g, s, i, s - 1), lay.peers(g, s, i, s + 1)
                st: List = []
                for m in range(M):
                    st += [RecvAct(m, u) for u in up] + [Forward(m)] + [SendAct(m, d) for d in down]
                for m in reversed(range(M)):
                    st += [RecvGrad(m, d) for d in down] + [Backward(m)] + [SendGrad(m, u) for u in up]
                lay.streams.append(st)
    return lay
