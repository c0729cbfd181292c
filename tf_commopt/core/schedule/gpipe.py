"""GPipe: synchronous pipeline with fill, drain and a flush every mini-batch.

Huang et al., "GPipe: Efficient Training of Giant Neural Networks using Pipeline Parallelism",
NeurIPS 2019. The exact rule, for ``P`` stages and ``M`` micro-batches, stage ``s``:

1. for ``i = 0 .. M-1``: receive activations ``i`` from ``s-1`` (if ``s > 0``), ``Forward(i)``, send
   activations ``i`` to ``s+1`` (if ``s < P-1``);
2. for ``i = M-1 .. 0`` (reverse order, as in GPipe's Figure 2): receive gradients ``i`` from ``s+1``
   (if ``s < P-1``), ``Backward(i)``, send gradients ``i`` to ``s-1`` (if ``s > 0``);
3. ``OptimizerStep()`` with the gradients accumulated over the ``M`` micro-batches (the flush).

With balanced stages (``t_f``, ``t_b`` per micro-batch) and free communication the iteration takes
``(M + P - 1) (t_f + t_b)``.

Example:
    >>> from tf_commopt.core.schedule.gpipe import gpipe
    >>> gpipe(2, 3).compact()
    ['F0 F1 F2 B2 B1 B0 U', 'F0 F1 F2 B2 B1 B0 U']
"""

from __future__ import annotations

from typing import List

from tf_commopt.core.schedule.base import Schedule
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
from tf_commopt.errors import InputError

__all__ = ["gpipe"]


def _check(num_stages: int, num_microbatches: int) -> None:
    for what, v in (("num_stages", num_stages), ("num_microbatches", num_microbatches)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"{what} must be a positive integer, got {v!r}")


def gpipe(num_stages: int, num_microbatches: int, optimizer_step: bool = True) -> Schedule:
    """The GPipe schedule (see module docstring).

    Args:
        num_stages: pipeline stages ``P`` (one rank each).
        num_microbatches: micro-batches ``M`` per mini-batch.
        optimizer_step: end each stream with ``OptimizerStep()`` (False lets a caller append an
            all-reduce first, e.g. grouped hybrid parallelism).
    """
    _check(num_stages, num_microbatches)
    p, m = num_stages, num_microbatches
    streams = []
    for s in range(p):
        st: List[Instruction] = []
        for i in range(m):
            if s > 0:
                st.append(RecvAct(i, s - 1))
            st.append(Forward(i))
            if s < p - 1:
                st.append(SendAct(i, s + 1))
        for i in reversed(range(m)):
            if s < p - 1:
                st.append(RecvGrad(i, s + 1))
            st.append(Backward(i))
            if s > 0:
                st.append(SendGrad(i, s - 1))
        if optimizer_step:
            st.append(OptimizerStep())
        streams.append(tuple(st))
    return Schedule("gpipe", m, tuple(streams), synchronous=True, microbatches_per_minibatch=m)
