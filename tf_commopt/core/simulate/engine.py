"""Discrete-event engine: runs a :class:`Schedule`'s instruction streams on devices and links.

The model (exact rules):

* Each rank runs its stream in order on its device. ``Forward`` / ``Backward`` / ``OptimizerStep`` /
  ``LocalStep`` occupy the device for the rank's per-micro-batch cost (:class:`RankCost`).
* ``SendAct`` / ``SendGrad`` never block the sender (a device computes and sends concurrently). The
  message goes on the link ``src device -> dst device``; a link direction carries one transfer at a
  time, first posted first served: it starts at ``max(post time, link free)``, occupies the link for
  ``bytes / bandwidth`` and arrives ``latency`` later. Ranks on the same device exchange for free.
* ``RecvAct`` / ``RecvGrad`` block until the message has arrived (the wait is idle time).
* ``AllReduce`` / ``Average`` block until every listed rank has issued it, then run a ring all-reduce
  (Patarasuk & Yuan 2009) of the key's bytes ``B`` over the ``N`` ranks' devices in rank order:
  ``2(N-1) latency + 2(N-1)/N B / bandwidth`` with the slowest ring link, starting when all ring links
  are free and holding them until it ends; it injects ``2(N-1) B`` bytes (each rank sends
  ``2(N-1)/N B``).

Events are processed in non-decreasing time order (a heap of rank clocks), so link queues are served
in post order. An instruction type the engine does not know raises :class:`PlanError`; so does a
deadlock (a receive whose send never comes).

Example:
    >>> from tf_commopt.core.devices import Cluster
    >>> from tf_commopt.core.schedule import gpipe
    >>> from tf_commopt.core.simulate.engine import Job, RankCost, run
    >>> job = Job(gpipe(2, 2), [RankCost(0, 1.0, 2.0), RankCost(1, 1.0, 2.0)], Cluster.homogeneous(2))
    >>> run(job).makespan_ms          # (M + P - 1)(t_f + t_b) = 3 * 3
    9.0
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, NamedTuple, Sequence, Tuple

from tf_commopt.core.devices import Cluster
from tf_commopt.core.schedule.base import Schedule
from tf_commopt.core.schedule.instructions import (
    AllReduce,
    Average,
    Backward,
    Forward,
    LocalStep,
    OptimizerStep,
    RecvAct,
    RecvGrad,
    SendAct,
    SendGrad,
)
from tf_commopt.errors import PlanError

__all__ = ["RankCost", "Job", "Event", "RunTrace", "run", "ring_allreduce_ms"]


@dataclass(frozen=True)
class RankCost:
    """Where a rank runs and what its instructions cost (ms per micro-batch, capacity already applied).

    ``forward_mb`` / ``backward_mb`` optionally override the cost of individual micro-batches
    (e.g. a measured last partial micro-batch).
    """

    device: int
    forward_ms: float
    backward_ms: float
    optimizer_ms: float = 0.0
    forward_mb: Mapping[int, float] = field(default_factory=dict)
    backward_mb: Mapping[int, float] = field(default_factory=dict)


@dataclass
class Job:
    """A schedule bound to costs.

    Attributes:
        schedule: the instruction streams.
        ranks: ``ranks[r]`` says where rank ``r`` runs and its costs.
        cluster: devices and links.
        message_bytes: ``("act" | "grad", src rank, dst rank) -> bytes`` of one micro-batch's message
            (missing pairs send 0 bytes).
        collective_bytes: key of an ``AllReduce`` / ``Average`` -> bytes reduced.
        split: micro-batches per profiled mini-batch (costs were divided by it); the run covers
            ``num_microbatches / split`` mini-batches.
    """

    schedule: Schedule
    ranks: Sequence[RankCost]
    cluster: Cluster
    message_bytes: Mapping[Tuple[str, int, int], float] = field(default_factory=dict)
    collective_bytes: Mapping[str, float] = field(default_factory=dict)
    split: float = 1.0


class Event(NamedTuple):
    """One timeline entry. ``kind``: forward, backward, optimizer, send_act, send_grad, allreduce,
    average. Transfers have ``device`` = sender device and ``peer`` = receiver device (-1 otherwise);
    collectives are recorded once per participating device."""

    kind: str
    rank: int
    device: int
    mb: int
    start: float
    end: float
    peer: int = -1
    nbytes: float = 0.0


@dataclass
class RunTrace:
    """What :func:`run` returns: the raw timeline and totals (see ``simulate.result`` for metrics)."""

    makespan_ms: float
    events: List[Event]
    busy_ms: Dict[int, float]
    bytes_total: float
    microbatch_done_ms: List[float]


def ring_allreduce_ms(nbytes: float, n: int, bytes_per_ms: float, latency_ms: float) -> float:
    """``2(N-1) latency + 2(N-1)/N nbytes / bandwidth`` (0 for one rank or no bytes)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2.0 * (n - 1) * latency_ms + 2.0 * (n - 1) / n * nbytes / bytes_per_ms


_TAG = {SendAct: "act", SendGrad: "grad", RecvAct: "act", RecvGrad: "grad"}


class _Engine:
    """The state of one run: rank clocks and program counters, link queues, messages in flight."""

    def __init__(self, job: Job):
        sched, ranks, cluster = job.schedule, list(job.ranks), job.cluster
        n = len(sched.streams)
        if len(ranks) != n:
            raise PlanError(
                f"{len(ranks)} rank costs for a schedule of {n} ranks", where=f"schedule {sched.name!r}"
            )
        for r, rc in enumerate(ranks):
            if not 0 <= rc.device < len(cluster):
                raise PlanError(
                    f"rank {r} placed on device {rc.device}, cluster has {len(cluster)}",
                    where=f"schedule {sched.name!r}",
                )
        self.job, self.sched, self.cluster, self.ranks = job, sched, cluster, ranks
        self.dev = [rc.device for rc in ranks]
        self.links: Dict[Tuple[int, int], Tuple[float, float]] = {}
        self.link_free: Dict[Tuple[int, int], float] = {}
        self.pc = [0] * n
        self.clock = [0.0] * n
        self.heap = [(0.0, r) for r in range(n)]
        self.msgs: Dict[tuple, float] = {}
        self.waiting: Dict[tuple, int] = {}
        self.colls: Dict[tuple, List[int]] = {}
        self.events: List[Event] = []
        self.busy: Dict[int, float] = {d: 0.0 for d in self.dev}
        self.done = [0.0] * sched.num_microbatches
        self.total_bytes = 0.0
        self.handlers = {Forward: self._compute, Backward: self._compute, SendAct: self._send,
                         SendGrad: self._send, RecvAct: self._recv, RecvGrad: self._recv,
                         OptimizerStep: self._step, LocalStep: self._step, AllReduce: self._collective,
                         Average: self._collective}  # fmt: skip

    def link(self, a: int, b: int) -> Tuple[float, float]:
        v = self.links.get((a, b))
        if v is None:
            lk = self.cluster.link(a, b)
            v = self.links[(a, b)] = (lk.bytes_per_ms, lk.latency_ms)
        return v

    def _compute(self, r: int, ins, t: float) -> bool:
        rc = self.ranks[r]
        if type(ins) is Forward:
            dur, kind = (
                (rc.forward_mb.get(ins.mb, rc.forward_ms) if rc.forward_mb else rc.forward_ms),
                "forward",
            )
        else:
            dur, kind = (
                (rc.backward_mb.get(ins.mb, rc.backward_ms) if rc.backward_mb else rc.backward_ms),
                "backward",
            )
            if t + dur > self.done[ins.mb]:
                self.done[ins.mb] = t + dur
        d = self.dev[r]
        self.events.append(Event(kind, r, d, ins.mb, t, t + dur))
        self.busy[d] += dur
        self.clock[r] = t + dur
        return True

    def _send(self, r: int, ins, t: float) -> bool:
        tag, p, d = _TAG[type(ins)], ins.peer, self.dev[r]
        nbytes = self.job.message_bytes.get((tag, r, p), 0.0)
        pd = self.dev[p]
        if pd == d or nbytes <= 0:
            arrival = t
        else:
            bpm, lat = self.link(d, pd)
            start = max(t, self.link_free.get((d, pd), 0.0))
            end = start + nbytes / bpm
            self.link_free[(d, pd)] = end
            arrival = end + lat
            self.total_bytes += nbytes
            self.events.append(Event("send_" + tag, r, d, ins.mb, start, end, pd, nbytes))
        key = (tag, r, p, ins.mb)
        w = self.waiting.pop(key, None)
        if w is None:
            self.msgs[key] = arrival
        else:  # the receiver was blocked on this message: it passes its receive
            self.pc[w] += 1
            if arrival > self.clock[w]:
                self.clock[w] = arrival
            heapq.heappush(self.heap, (self.clock[w], w))
        return True

    def _recv(self, r: int, ins, t: float) -> bool:
        key = (_TAG[type(ins)], ins.peer, r, ins.mb)
        arrival = self.msgs.pop(key, None)
        if arrival is None:
            self.waiting[key] = r
            return False
        if arrival > t:
            self.clock[r] = arrival
        return True

    def _step(self, r: int, ins, t: float) -> bool:
        dur = self.ranks[r].optimizer_ms
        if dur > 0:
            d = self.dev[r]
            self.events.append(Event("optimizer", r, d, -1, t, t + dur))
            self.busy[d] += dur
            self.clock[r] = t + dur
        return True

    def _collective(self, r: int, ins, t: float) -> bool:
        ty = type(ins)
        ckey = (ty, ins.key, ins.ranks)
        arrived = self.colls.setdefault(ckey, [])
        arrived.append(r)
        if len(arrived) < len(ins.ranks):
            return False
        del self.colls[ckey]
        self.total_bytes += _collective(
            self.job, ins, ty, self.dev, self.clock, self.link, self.link_free, self.events.append
        )
        for q in ins.ranks:
            if q != r:
                self.pc[q] += 1
                heapq.heappush(self.heap, (self.clock[q], q))
        return True

    def run(self) -> RunTrace:
        streams, heap, pc, clock, handlers = self.sched.streams, self.heap, self.pc, self.clock, self.handlers
        while heap:
            _, r = heapq.heappop(heap)
            stream = streams[r]
            while pc[r] < len(stream):
                t = clock[r]
                if heap and t > heap[0][0]:  # another rank is earlier: process events in time order
                    heapq.heappush(heap, (t, r))
                    break
                ins = stream[pc[r]]
                handler = handlers.get(type(ins))
                if handler is None:
                    raise PlanError(
                        f"unknown instruction {ins!r}", where=f"schedule {self.sched.name!r} rank {r}"
                    )
                if not handler(r, ins, t):
                    break  # blocked: a receive or a collective resumes it
                pc[r] += 1
        stuck = [r for r in range(len(streams)) if pc[r] < len(streams[r])]
        if stuck:
            r = stuck[0]
            raise PlanError(
                f"deadlock: rank {r} waits forever at instruction {pc[r]} ({streams[r][pc[r]]!r})",
                where=f"schedule {self.sched.name!r}",
            )
        return RunTrace(max(clock) if clock else 0.0, self.events, self.busy, self.total_bytes, self.done)


def run(job: Job) -> RunTrace:
    """Simulate ``job`` (see the module docstring for the rules)."""
    return _Engine(job).run()


def _collective(job: Job, ins, ty, dev, clock, link, link_free, add) -> float:
    """Run one ring collective; set its ranks' clocks to its end; return bytes injected."""
    group = list(ins.ranks)
    nbytes = float(job.collective_bytes.get(ins.key, 0.0))
    devs = list(dict.fromkeys(dev[q] for q in group))  # distinct devices, in rank order
    n = len(devs)
    ring = [(devs[i], devs[(i + 1) % len(devs)]) for i in range(len(devs))] if n > 1 else []
    start = max(clock[q] for q in group)
    for lk in ring:
        start = max(start, link_free.get(lk, 0.0))
    if ring:
        bpm = min(link(a, b)[0] for a, b in ring)
        lat = max(link(a, b)[1] for a, b in ring)
    else:
        bpm, lat = 1.0, 0.0
    dur = ring_allreduce_ms(nbytes, n, bpm, lat)
    end = start + dur
    for lk in ring:
        link_free[lk] = end
    kind = "allreduce" if ty is AllReduce else "average"
    for q in group:
        add(Event(kind, q, dev[q], -1, start, end, -1, 2.0 * (n - 1) / n * nbytes if n > 1 else 0.0))
        clock[q] = end
    return 2.0 * (n - 1) * nbytes if n > 1 else 0.0
