"""SimResult: the metrics of a simulated run, derived from the engine's timeline.

Definitions (one mini-batch = the profiled batch; a run covers ``num_microbatches / split`` of them):

* synchronous schedules (GPipe, data parallel, local SGD): ``iteration_ms`` = makespan per mini-batch,
  ``throughput`` = mini-batches per second = ``1000 / iteration_ms``, ``bubble_fraction`` =
  ``1 - sum(device busy) / (devices * makespan)``;
* asynchronous schedules (PipeDream 1F1B): the steady state. Micro-batch ``i`` is done when its last
  ``Backward`` ends (``d_i``); with ``P`` ranks and ``N >= 2P + 2`` micro-batches the rate is
  ``(N - 1 - 2P) / (d_{N-1-P} - d_P)`` micro-batches per ms (start-up and drain excluded), else
  ``N / makespan``. ``throughput = 1000 * rate / split``, ``iteration_ms = 1000 / throughput``,
  ``bubble_fraction = 1 - (sum(device busy) / N) * rate / devices``.
* ``bytes_injected``: bytes put on the network per mini-batch (point-to-point messages between
  different devices, plus ``2(N-1) B`` per ring all-reduce of ``B`` bytes over ``N`` devices).

Example:
    >>> from tf_commopt.core.devices import Cluster
    >>> from tf_commopt.core.schedule import gpipe
    >>> from tf_commopt.core.simulate.engine import Job, RankCost
    >>> from tf_commopt.core.simulate.result import simulate_job
    >>> r = simulate_job(Job(gpipe(2, 2), [RankCost(0, 1, 2), RankCost(1, 1, 2)], Cluster.homogeneous(2), split=2))
    >>> r.iteration_ms, round(r.bubble_fraction, 3)
    (9.0, 0.333)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List

from tf_commopt.core.simulate.engine import Event, Job, run

__all__ = ["SimResult", "simulate_job"]


@dataclass
class SimResult:
    """Metrics of one simulated run (see module docstring for the definitions)."""

    schedule: str
    num_microbatches: int
    split: float
    minibatches: float
    makespan_ms: float
    iteration_ms: float
    throughput: float
    bubble_fraction: float
    busy_ms: Dict[int, float]
    bytes_injected: float
    events: List[Event] = field(repr=False, default_factory=list)
    microbatch_done_ms: List[float] = field(repr=False, default_factory=list)
    extra: Dict[str, Any] = field(default_factory=dict)

    def to_dict(self, events: bool = False) -> Dict[str, Any]:
        """A JSON-ready dict (the timeline only if ``events``)."""
        d = {
            "schedule": self.schedule,
            "iteration_ms": self.iteration_ms,
            "throughput": self.throughput,
            "bubble_fraction": self.bubble_fraction,
            "bytes_injected": self.bytes_injected,
            "makespan_ms": self.makespan_ms,
            "num_microbatches": self.num_microbatches,
            "split": self.split,
            "minibatches": self.minibatches,
            "busy_ms": {str(k): v for k, v in sorted(self.busy_ms.items())},
        }
        d.update(self.extra)
        if events:
            d["events"] = [e._asdict() for e in self.events]
        return d


def simulate_job(job: Job) -> SimResult:
    """Run ``job`` through the engine and derive the metrics."""
    tr = run(job)
    sched = job.schedule
    n_mb = sched.num_microbatches
    split = float(job.split)
    minibatches = n_mb / split
    ndev = max(1, len(tr.busy_ms))
    busy_total = sum(tr.busy_ms.values())
    makespan = tr.makespan_ms
    p = sched.num_ranks
    if sched.synchronous:
        iteration = makespan / minibatches
        throughput = 1000.0 / iteration if iteration > 0 else float("inf")
        bubble = 1.0 - busy_total / (ndev * makespan) if makespan > 0 else 0.0
    else:
        d = tr.microbatch_done_ms
        if n_mb >= 2 * p + 2 and d[n_mb - 1 - p] > d[p]:
            rate = (n_mb - 1 - 2 * p) / (d[n_mb - 1 - p] - d[p])
        else:
            rate = n_mb / makespan if makespan > 0 else float("inf")
        throughput = 1000.0 * rate / split
        iteration = 1000.0 / throughput if throughput > 0 else float("inf")
        bubble = max(0.0, 1.0 - (busy_total / n_mb) * rate / ndev)
    return SimResult(
        schedule=sched.name,
        num_microbatches=n_mb,
        split=split,
        minibatches=minibatches,
        makespan_ms=makespan,
        iteration_ms=iteration,
        throughput=throughput,
        bubble_fraction=bubble,
        busy_ms=dict(tr.busy_ms),
        bytes_injected=tr.bytes_total / minibatches,
        events=tr.events,
        microbatch_done_ms=list(tr.microbatch_done_ms),
    )
