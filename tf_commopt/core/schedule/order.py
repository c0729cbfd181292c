"""One global order of a schedule's per-rank streams, for an executor that issues them from one thread.

Example:
    >>> from tf_commopt.core.schedule import gpipe, short
    >>> from tf_commopt.core.schedule.order import execution_order
    >>> [f"{r}:{short(i)}" for r, i in execution_order(gpipe(2, 1))]
    ['0:F0', '0:SA0>1', '1:RA0<0', '1:F0', '1:B0', '1:SG0>0', '1:U', '0:RG0<1', '0:B0', '0:U']
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from tf_commopt.core.schedule.base import Schedule
from tf_commopt.core.schedule.instructions import (
    AllReduce,
    Backward,
    Forward,
    OptimizerStep,
    RecvAct,
    RecvGrad,
    SendAct,
    SendGrad,
)
from tf_commopt.errors import PlanError

__all__ = ["execution_order", "KNOWN"]

KNOWN = (Forward, Backward, SendAct, RecvAct, SendGrad, RecvGrad, AllReduce, OptimizerStep)


def execution_order(schedule: Schedule) -> List[Tuple[int, Any]]:
    """One global order of a schedule's per-rank streams that honours every Recv (it waits for its Send)
    and every AllReduce (no listed rank passes it before all have reached it).

    Ranks are pipeline stages. Ranks are visited round-robin; each runs its stream until it reaches a
    receive whose send has not happened yet. An instruction type the executor does not know is a
    PlanError (never skipped).

    >>> from tf_commopt.core.schedule import gpipe
    >>> [f"{r}:{type(i).__name__}" for r, i in execution_order(gpipe(2, 1)) if isinstance(i, (Forward, Backward))]
    ['0:Forward', '1:Forward', '1:Backward', '0:Backward']
    """
    streams = [list(st) for st in schedule.streams]
    pos = [0] * len(streams)
    sent = set()
    arrived: Dict[tuple, set] = {}
    seen_coll: List[Dict[tuple, int]] = [dict() for _ in streams]
    out: List[Tuple[int, Any]] = []
    while any(p < len(st) for p, st in zip(pos, streams)):
        progressed = False
        for r, st in enumerate(streams):
            while pos[r] < len(st):
                ins = st[pos[r]]
                if not isinstance(ins, KNOWN):
                    raise PlanError(
                        f"unknown instruction {ins!r}", where=f"schedule {schedule.name!r} rank {r}"
                    )
                if isinstance(ins, (RecvAct, RecvGrad)):
                    kind = SendAct if isinstance(ins, RecvAct) else SendGrad
                    if (kind, ins.peer, r, ins.mb) not in sent:
                        break
                if isinstance(ins, AllReduce):  # collective: every listed rank must have reached it
                    k = (ins.key, ins.ranks, seen_coll[r].get((ins.key, ins.ranks), 0))
                    arrived.setdefault(k, set()).add(r)
                    if not set(ins.ranks) <= arrived[k]:
                        break
                    seen_coll[r][(ins.key, ins.ranks)] = k[2] + 1
                if isinstance(ins, (SendAct, SendGrad)):
                    sent.add((type(ins), r, ins.peer, ins.mb))
                out.append((r, ins))
                pos[r] += 1
                progressed = True
        if not progressed:
            raise PlanError(
                "the streams deadlock (a receive whose send never comes)", where=f"schedule {schedule.name!r}"
            )
    return out
