"""Schedule instructions: the small frozen values a schedule is made of.

A schedule is *data*: one instruction stream per rank (a pipeline stage, or a data-parallel worker).
The simulator (:mod:`tf_commopt.core.simulate`) and the TensorFlow executor read the same streams; an
instruction type they do not know is an error, never silently skipped.

Semantics (what every reader must implement):

* ``Forward(mb)`` / ``Backward(mb)``: run this rank's forward / backward pass of micro-batch ``mb``.
* ``SendAct(mb, peer)`` / ``RecvAct(mb, peer)``: send the activations of micro-batch ``mb`` to rank
  ``peer`` / wait for them from rank ``peer``. A send never blocks the sender (a device computes and
  sends concurrently); a receive blocks until the message has arrived.
* ``SendGrad(mb, peer)`` / ``RecvGrad(mb, peer)``: the same for the gradients flowing backwards.
* ``AllReduce(key, ranks)``: a blocking collective among ``ranks`` (sum of the tensors named ``key``,
  e.g. the gradients of one stage); every listed rank must issue it.
* ``Average(key, ranks)``: a blocking model average among ``ranks`` (local SGD / skip-and-correct).
* ``OptimizerStep()``: apply the (accumulated) gradients, e.g. at the end of a GPipe mini-batch or after
  every backward in PipeDream's asynchronous 1F1B.
* ``LocalStep()``: apply a replica's own gradient without synchronising (local SGD).

Example:
    >>> from tf_commopt.core.schedule.instructions import Forward, SendAct, short
    >>> Forward(0), short(SendAct(2, peer=1))
    (Forward(mb=0), 'SA2>1')
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Tuple, Union

__all__ = [
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
    "INSTRUCTION_TYPES",
    "short",
    "shift_ranks",
]


@dataclass(frozen=True)
class Forward:
    """Forward pass of micro-batch ``mb`` on this rank."""

    mb: int


@dataclass(frozen=True)
class Backward:
    """Backward pass of micro-batch ``mb`` on this rank."""

    mb: int


@dataclass(frozen=True)
class SendAct:
    """Send micro-batch ``mb``'s activations to rank ``peer`` (non-blocking)."""

    mb: int
    peer: int


@dataclass(frozen=True)
class RecvAct:
    """Wait for micro-batch ``mb``'s activations from rank ``peer``."""

    mb: int
    peer: int


@dataclass(frozen=True)
class SendGrad:
    """Send micro-batch ``mb``'s activation gradients to rank ``peer`` (non-blocking)."""

    mb: int
    peer: int


@dataclass(frozen=True)
class RecvGrad:
    """Wait for micro-batch ``mb``'s activation gradients from rank ``peer``."""

    mb: int
    peer: int


@dataclass(frozen=True)
class AllReduce:
    """Blocking all-reduce of the tensors named ``key`` among ``ranks`` (sorted, unique)."""

    key: str
    ranks: Tuple[int, ...]


@dataclass(frozen=True)
class Average:
    """Blocking model average of the variables named ``key`` among ``ranks``."""

    key: str
    ranks: Tuple[int, ...]


@dataclass(frozen=True)
class OptimizerStep:
    """Apply this rank's accumulated gradients (after any all-reduce)."""


@dataclass(frozen=True)
class LocalStep:
    """Apply this rank's own gradients without synchronisation (local SGD)."""


Instruction = Union[
    Forward, Backward, SendAct, RecvAct, SendGrad, RecvGrad, AllReduce, Average, OptimizerStep, LocalStep
]
INSTRUCTION_TYPES = (
    Forward,
    Backward,
    SendAct,
    RecvAct,
    SendGrad,
    RecvGrad,
    AllReduce,
    Average,
    OptimizerStep,
    LocalStep,
)

_SHORT = {Forward: "F", Backward: "B", SendAct: "SA", RecvAct: "RA", SendGrad: "SG", RecvGrad: "RG"}


def short(ins: Instruction) -> str:
    """A compact text form: ``F3``, ``B3``, ``SA3>1`` (send to 1), ``RG3<2`` (receive from 2), ``U``,
    ``L``, ``AR(key:0,1)``, ``AVG(key:0,1)``."""
    t = type(ins)
    if t in (Forward, Backward):
        return f"{_SHORT[t]}{ins.mb}"
    if t in (SendAct, SendGrad):
        return f"{_SHORT[t]}{ins.mb}>{ins.peer}"
    if t in (RecvAct, RecvGrad):
        return f"{_SHORT[t]}{ins.mb}<{ins.peer}"
    if t is OptimizerStep:
        return "U"
    if t is LocalStep:
        return "L"
    if t in (AllReduce, Average):
        name = "AR" if t is AllReduce else "AVG"
        return f"{name}({ins.key}:{','.join(map(str, ins.ranks))})"
    raise TypeError(f"unknown schedule instruction {ins!r}")


def shift_ranks(ins: Instruction, offset: int) -> Instruction:
    """The instruction with every rank it names shifted by ``offset`` (to compose several pipelines,
    e.g. one per group in grouped hybrid parallelism)."""
    t = type(ins)
    if t in (SendAct, RecvAct, SendGrad, RecvGrad):
        return replace(ins, peer=ins.peer + offset)
    if t in (AllReduce, Average):
        return replace(ins, ranks=tuple(r + offset for r in ins.ranks))
    if t in INSTRUCTION_TYPES:
        return ins
    raise TypeError(f"unknown schedule instruction {ins!r}")
