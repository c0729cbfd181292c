"""Discrete-event simulation of schedules (pipelines, data parallelism) on devices and links.

Example:
    >>> from tf_commopt.core.costgraph import CostGraph, Node
    >>> from tf_commopt.core.plan import PartitionPlan
    >>> from tf_commopt.core.simulate import simulate_pipeline
    >>> g = CostGraph([Node("a", 1, 2), Node("b", 1, 2)], [("a", "b")])
    >>> plan = PartitionPlan("x", {"a": 0, "b": 1}, [0, 1], [3, 3], [0, 0], [0, 0], 3, 0)
    >>> round(simulate_pipeline(g, plan, "1f1b", microbatches=20).throughput, 3)   # 1 / 3 ms
    333.333
"""

from tf_commopt.core.simulate.dataparallel import (
    data_parallel_job,
    simulate_data_parallel,
    simulate_local_sgd,
)
from tf_commopt.core.simulate.engine import Event, Job, RankCost, RunTrace, ring_allreduce_ms, run
from tf_commopt.core.simulate.pipeline import hop_bytes, pipeline_job, simulate_pipeline, stage_costs
from tf_commopt.core.simulate.result import SimResult, simulate_job

__all__ = [
    "Event",
    "Job",
    "RankCost",
    "RunTrace",
    "run",
    "ring_allreduce_ms",
    "SimResult",
    "simulate_job",
    "hop_bytes",
    "stage_costs",
    "pipeline_job",
    "simulate_pipeline",
    "data_parallel_job",
    "simulate_data_parallel",
    "simulate_local_sgd",
]
