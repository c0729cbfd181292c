"""Data-parallel schedules: synchronous SGD (gradient all-reduce) and local SGD (periodic averaging).

The exact rules, for ``N`` workers (ranks ``0 .. N-1``), each holding the whole model:

* ``data_parallel(N, M)``: every worker runs ``Forward(i), Backward(i)`` for its ``M`` micro-batches
  (gradient accumulation; ``M = 1`` is plain synchronous SGD), then ``AllReduce("grads", all)`` and
  ``OptimizerStep()``. One stream is one synchronous iteration.
* ``local_sgd(N, H)``: ``H`` local steps ``Forward(t), Backward(t), LocalStep()`` for ``t = 0 .. H-1``,
  then ``Average("params", all)`` (Lin et al., "Don't Use Large Mini-Batches, Use Local SGD", ICLR 2020;
  skip-and-correct adds its correction to the same period). One stream is one averaging period.

In the simulator a ring all-reduce of ``B`` bytes over ``N`` ranks costs
``2(N-1) latency + 2(N-1)/N B / bandwidth`` (Patarasuk & Yuan 2009).

Example:
    >>> from tf_commopt.core.schedule.dataparallel import data_parallel, local_sgd
    >>> data_parallel(2).compact()
    ['F0 B0 AR(grads:0,1) U', 'F0 B0 AR(grads:0,1) U']
    >>> local_sgd(2, 2).compact()[0]
    'F0 B0 L F1 B1 L AVG(params:0,1)'
"""

from __future__ import annotations

from typing import List

from tf_commopt.core.schedule.base import Schedule
from tf_commopt.core.schedule.gpipe import _check
from tf_commopt.core.schedule.instructions import (
    AllReduce,
    Average,
    Backward,
    Forward,
    Instruction,
    LocalStep,
    OptimizerStep,
)

__all__ = ["data_parallel", "local_sgd"]


def data_parallel(num_workers: int, num_microbatches: int = 1) -> Schedule:
    """Synchronous data parallelism with gradient accumulation over ``num_microbatches``."""
    _check(num_workers, num_microbatches)
    ranks = tuple(range(num_workers))
    streams = []
    for _ in ranks:
        st: List[Instruction] = []
        for i in range(num_microbatches):
            st += [Forward(i), Backward(i)]
        st += [AllReduce("grads", ranks), OptimizerStep()]
        streams.append(tuple(st))
    return Schedule(
        "data_parallel",
        num_microbatches,
        tuple(streams),
        synchronous=True,
        microbatches_per_minibatch=num_microbatches,
    )


def local_sgd(num_workers: int, interval: int) -> Schedule:
    """One averaging period of local SGD: ``interval`` local steps, then a model average."""
    _check(num_workers, interval)
    ranks = tuple(range(num_workers))
    streams = []
    for _ in ranks:
        st: List[Instruction] = []
        for t in range(interval):
            st += [Forward(t), Backward(t), LocalStep()]
        st.append(Average("params", ranks))
        streams.append(tuple(st))
    return Schedule(
        "local_sgd",
        interval,
        tuple(streams),
        synchronous=True,
        microbatches_per_minibatch=1,
        meta={"interval": interval},
    )
