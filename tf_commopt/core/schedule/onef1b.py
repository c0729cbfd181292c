"""PipeDream 1F1B: asynchronous pipeline, one forward one backward, with weight stashing.

Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN Training", SOSP 2019. The exact
rule, for ``P`` stages and ``N`` micro-batches (in PipeDream every micro-batch is a mini-batch with its
own weight update), stage ``s``:

1. start-up: ``w = min(P - s, N)`` forwards (receive activations from ``s-1`` if ``s > 0``,
   ``Forward(i)``, send to ``s+1`` if ``s < P-1``) for ``i = 0 .. w-1`` — PipeDream's
   NUM_OPT_ACTIVE_MINIBATCHES = ceil(#machines / #input-stage replicas) at the input stage;
2. steady state: for ``j = 0 .. N-1``: the backward of ``j`` (receive gradients from ``s+1`` if
   ``s < P-1``, ``Backward(j)``, send gradients to ``s-1`` if ``s > 0``), ``OptimizerStep()``, then the
   forward of ``j + w`` if ``j + w < N`` (so the drain is backwards only).

Weight stashing: ``Forward(i)`` uses the weights after the updates this stage has applied so far and
stashes them; ``Backward(i)`` uses the stashed version (see :func:`weight_versions`): the stage ``s``
sees version ``max(0, i - (P - s) + 1)`` for micro-batch ``i``, i.e. staleness ``P - s - 1``.

With balanced stages and free communication the steady state completes one micro-batch every
``t_f + t_b`` (throughput = 1 / slowest stage).

Example:
    >>> from tf_commopt.core.schedule.onef1b import onef1b
    >>> onef1b(2, 3).compact()
    ['F0 F1 B0 U F2 B1 U B2 U', 'F0 B0 U F1 B1 U F2 B2 U']
"""

from __future__ import annotations

from typing import Dict, List

from tf_commopt.core.schedule.base import Schedule
from tf_commopt.core.schedule.gpipe import _check
from tf_commopt.core.schedule.instructions import (
    Backward,
    Forward,
    Instruction,
    OptimizerStep,
    RecvAct,
    RecvGrad,
    SendAct,
    SendGrad,
)

__all__ = ["onef1b", "weight_versions"]


def _forward(st: List[Instruction], i: int, s: int, p: int) -> None:
    """Append stage ``s``'s forward of micro-batch ``i`` with its receive and send."""
    if s > 0:
        st.append(RecvAct(i, s - 1))
    st.append(Forward(i))
    if s < p - 1:
        st.append(SendAct(i, s + 1))


def onef1b(num_stages: int, num_microbatches: int, flush: bool = False) -> Schedule:
    """PipeDream's asynchronous 1F1B schedule with weight stashing (see module docstring).

    With ``flush=True``: PipeDream-Flush (Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN
    Training", ICML 2021; Megatron-LM's schedule): the same order without the per-backward updates,
    one ``OptimizerStep`` after the last backward; synchronous, ``num_microbatches`` per mini-batch,
    no stashing needed.

    >>> onef1b(2, 3, flush=True).compact()
    ['F0 F1 B0 F2 B1 B2 U', 'F0 B0 F1 B1 F2 B2 U']
    """
    _check(num_stages, num_microbatches)
    p, n = num_stages, num_microbatches
    streams = []
    for s in range(p):
        st: List[Instruction] = []
        w = min(p - s, n)
        for i in range(w):
            _forward(st, i, s, p)
        for j in range(n):
            if s < p - 1:
                st.append(RecvGrad(j, s + 1))
            st.append(Backward(j))
            if s > 0:
                st.append(SendGrad(j, s - 1))
            if not flush:
                st.append(OptimizerStep())
            if j + w < n:
                _forward(st, j + w, s, p)
        if flush:
            st.append(OptimizerStep())
        streams.append(tuple(st))
    if flush:
        return Schedule(
            "1f1b_flush",
            n,
            tuple(streams),
            synchronous=True,
            microbatches_per_minibatch=n,
            meta={"weight_stashing": False},
        )
    return Schedule(
        "1f1b",
        n,
        tuple(streams),
        synchronous=False,
        microbatches_per_minibatch=1,
        meta={"weight_stashing": True},
    )


def weight_versions(schedule: Schedule) -> List[Dict[int, int]]:
    """For each rank, micro-batch -> the weight version its ``Forward`` used (number of
    ``OptimizerStep`` before it on that rank); with weight stashing its ``Backward`` uses the same.

    >>> weight_versions(onef1b(2, 3))
    [{0: 0, 1: 0, 2: 1}, {0: 0, 1: 1, 2: 2}]
    """
    out = []
    for stream in schedule.streams:
        version, seen = 0, {}
        for ins in stream:
            if isinstance(ins, OptimizerStep):
                version += 1
            elif isinstance(ins, Forward):
                seen[ins.mb] = version
        out.append(seen)
    return out
