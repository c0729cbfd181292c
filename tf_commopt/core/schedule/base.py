"""Schedule: one instruction stream per rank, validated.

Example:
    >>> from tf_commopt.core.schedule.base import Schedule
    >>> from tf_commopt.core.schedule.instructions import Forward, Backward, OptimizerStep
    >>> s = Schedule("single", num_microbatches=1, streams=((Forward(0), Backward(0), OptimizerStep()),))
    >>> s.compact()
    ['F0 B0 U']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

from tf_commopt.core.schedule.instructions import (
    INSTRUCTION_TYPES,
    AllReduce,
    Average,
    Instruction,
    RecvAct,
    RecvGrad,
    SendAct,
    SendGrad,
    shift_ranks,
    short,
)
from tf_commopt.errors import PlanError

__all__ = ["Schedule", "combine"]

_PAIR = {SendAct: RecvAct, SendGrad: RecvGrad}


@dataclass(frozen=True)
class Schedule:
    """Instruction streams, one per rank.

    Attributes:
        name: e.g. ``"gpipe"``, ``"1f1b"``, ``"data_parallel"``.
        num_microbatches: micro-batches each stream processes (numbered 0 .. num_microbatches-1).
        streams: ``streams[r]`` is rank ``r``'s instruction sequence.
        synchronous: True if the schedule flushes (the whole stream is one mini-batch iteration);
            False for an asynchronous steady-state schedule (PipeDream 1F1B).
        microbatches_per_minibatch: how many micro-batches make one mini-batch (one optimizer update
            of the synchronous model). GPipe: ``num_microbatches``; asynchronous 1F1B: 1.
        meta: free details (e.g. ``{"weight_stashing": True}``).

    Raises:
        PlanError: an unknown instruction, a micro-batch out of range, a send without its receive
            (or the reverse), a collective whose ranks do not all issue it.
    """

    name: str
    num_microbatches: int
    streams: Tuple[Tuple[Instruction, ...], ...]
    synchronous: bool = True
    microbatches_per_minibatch: int = 1
    meta: Dict[str, object] = field(default_factory=dict, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "streams", tuple(tuple(s) for s in self.streams))
        self.validate()

    @property
    def num_ranks(self) -> int:
        return len(self.streams)

    def compact(self, compute_only: bool = True) -> List[str]:
        """Each stream as a short string: ``"F0 F1 B1 B0 U"`` (sends/receives too if not ``compute_only``)."""
        skip = (SendAct, RecvAct, SendGrad, RecvGrad) if compute_only else ()
        return [" ".join(short(i) for i in s if not isinstance(i, skip)) for s in self.streams]

    def validate(self) -> None:
        """Check the streams are well formed (see class docstring)."""
        n, m = self.num_ranks, self.num_microbatches
        if n < 1:
            raise PlanError("a schedule needs at least one stream", where=f"schedule {self.name!r}")
        if not isinstance(m, int) or m < 1:
            raise PlanError(
                f"num_microbatches must be a positive integer, got {m!r}", where=f"schedule {self.name!r}"
            )
        sends: Dict[tuple, int] = {}
        recvs: Dict[tuple, int] = {}
        colls: Dict[tuple, List[int]] = {}
        for r, stream in enumerate(self.streams):
            for k, ins in enumerate(stream):
                where = f"schedule {self.name!r} rank {r} instruction {k}"
                t = type(ins)
                if t not in INSTRUCTION_TYPES:
                    raise PlanError(f"unknown instruction {ins!r}", where=where)
                mb = getattr(ins, "mb", 0)
                if not 0 <= mb < m:
                    raise PlanError(f"micro-batch {mb} out of range [0, {m})", where=where)
                peer = getattr(ins, "peer", None)
                if peer is not None and not (0 <= peer < n and peer != r):
                    raise PlanError(f"bad peer rank {peer} in {short(ins)}", where=where)
                if t in _PAIR:
                    key = (_PAIR[t], r, peer, mb)
                    if key in sends:
                        raise PlanError(f"duplicate {short(ins)}", where=where)
                    sends[key] = r
                elif t in (RecvAct, RecvGrad):
                    key = (t, peer, r, mb)
                    if key in recvs:
                        raise PlanError(f"duplicate {short(ins)}", where=where)
                    recvs[key] = r
                elif t in (AllReduce, Average):
                    if r not in ins.ranks or len(set(ins.ranks)) != len(ins.ranks):
                        raise PlanError(f"{short(ins)} must list distinct ranks including {r}", where=where)
                    colls.setdefault((t, ins.key, ins.ranks), []).append(r)
        for key in sends.keys() - recvs.keys():
            raise PlanError(
                f"rank {key[1]} sends {key[0].__name__[4:].lower()} of micro-batch {key[3]} "
                f"to rank {key[2]}, which never receives it",
                where=f"schedule {self.name!r}",
            )
        for key in recvs.keys() - sends.keys():
            raise PlanError(
                f"rank {key[2]} waits for {key[0].__name__[4:].lower()} of micro-batch {key[3]} "
                f"from rank {key[1]}, which never sends it",
                where=f"schedule {self.name!r}",
            )
        for (t, key, ranks), issued in colls.items():
            counts = {r: issued.count(r) for r in ranks}
            if len(set(counts.values())) != 1:
                raise PlanError(
                    f"collective {t.__name__}({key}) over ranks {list(ranks)} is issued "
                    f"{counts} times per rank",
                    where=f"schedule {self.name!r}",
                )


def combine(name: str, parts: Sequence[Schedule], extra: Sequence[Sequence[Instruction]] = ()) -> Schedule:
    """Place several schedules side by side (ranks renumbered consecutively), then append ``extra[r]``
    to the combined stream ``r`` (e.g. per-stage all-reduces across pipeline groups).

    >>> from tf_commopt.core.schedule.gpipe import gpipe
    >>> combine("two", [gpipe(2, 1), gpipe(2, 1)]).num_ranks
    4
    """
    streams: List[List[Instruction]] = []
    for p in parts:
        off = len(streams)
        streams.extend([shift_ranks(i, off) for i in s] for s in p.streams)
    for r, tail in enumerate(extra):
        streams[r].extend(tail)
    m = max(p.num_microbatches for p in parts)
    return Schedule(
        name,
        m,
        tuple(tuple(s) for s in streams),
        all(p.synchronous for p in parts),
        max(p.microbatches_per_minibatch for p in parts),
    )
