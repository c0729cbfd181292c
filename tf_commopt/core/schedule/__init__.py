"""Schedules as data: per-rank instruction streams for GPipe, PipeDream 1F1B, data parallelism and the
grouped hybrid.

The simulator (:mod:`tf_commopt.core.simulate`) and the TensorFlow executors read the same streams.
Modules: :mod:`instructions`, :mod:`base` (the validated :class:`Schedule`), :mod:`gpipe`,
:mod:`onef1b`, :mod:`dataparallel`, :mod:`hybrid` (the grouped hybrid's program, with
:mod:`buckets`, :mod:`hybrid_layout` and :mod:`hybrid_overlap`), :mod:`order` (one global order of the
streams for an executor).

Example:
    >>> from tf_commopt.core.schedule import gpipe, onef1b
    >>> gpipe(2, 2).compact(), onef1b(2, 2).compact()
    (['F0 F1 B1 B0 U', 'F0 F1 B1 B0 U'], ['F0 F1 B0 U B1 U', 'F0 B0 U F1 B1 U'])
"""

from tf_commopt.core.schedule.base import Schedule, combine
from tf_commopt.core.schedule.buckets import DEFAULT_BUCKET_BYTES, Bucket, make_buckets
from tf_commopt.core.schedule.dataparallel import data_parallel, local_sgd
from tf_commopt.core.schedule.gpipe import gpipe
from tf_commopt.core.schedule.hybrid import (
    HybridProgram,
    RankRole,
    batch_fractions,
    check_groups,
    hybrid_program,
    split_batch,
)
from tf_commopt.core.schedule.instructions import (
    AllReduce,
    Average,
    Backward,
    Forward,
    Instruction,
    LocalStep,
    OptimizerStep,
    RecvAct,
    RecvGrad,
    SendAct,
    SendGrad,
    short,
)
from tf_commopt.core.schedule.onef1b import onef1b, weight_versions
from tf_commopt.core.schedule.order import execution_order

SCHEDULES = {"gpipe": gpipe, "1f1b": onef1b, "1f1b_flush": lambda p, m: onef1b(p, m, flush=True)}

__all__ = [
    "Schedule",
    "combine",
    "gpipe",
    "onef1b",
    "weight_versions",
    "data_parallel",
    "local_sgd",
    "SCHEDULES",
    "Forward",
    "Backward",
    "SendAct",
    "RecvAct",
    "SendGrad",
    "RecvGrad",
    "AllReduce",
    "Average",
    "OptimizerStep",
    "LocalStep",
    "Instruction",
    "short",
    "hybrid_program",
    "HybridProgram",
    "RankRole",
    "Bucket",
    "make_buckets",
    "DEFAULT_BUCKET_BYTES",
    "split_batch",
    "batch_fractions",
    "check_groups",
    "execution_order",
]
