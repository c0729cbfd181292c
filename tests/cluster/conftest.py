"""The clusters the cluster tests share (helpers: tests/cluster/workers.py).

``sc_cluster`` runs every scenario of a first 2-worker cluster (plain, overlapped, compressed, time periods,
mixed precision, the first halves of the save/restore and backup jobs), ``sc_cluster_again`` a second
cluster after it (the restored halves, the hybrid, the collectives count); ``worker_cluster`` is
``run_workers`` for a test's own cluster. A test reads its scenario with ``run.results("sc")``: one dict
per worker, lists as float64 arrays, or a failure that shows the last lines of every task.

Example:
    def test_something(sc_cluster):
        first, second = sc_cluster.results("sc")
"""

import pytest

from tests.cluster.workers import WorkerRun, run_workers

FIRST = [
    "sc",
    "overlap",
    "overlap_race",
    "compressed",
    "compressed:bf16:overlap",
    "timeperiod",
    "mixed",
    "restore:first",
    "backup:whole:sgd",
    "backup:interrupt:sgd",
    "backup:whole:adam",
    "backup:interrupt:adam",
]
SECOND = ["restore:resume", "backup:resume:sgd", "backup:resume:adam", "hybrid", "collectives"]


@pytest.fixture
def worker_cluster():
    """``run_workers`` for a test's own cluster, e.g. ``worker_cluster(tmp_path, ["auto"], bandwidth_mbit=20)``."""
    return run_workers


@pytest.fixture(scope="session")
def sc_cluster(tmp_path_factory) -> WorkerRun:
    """The first 2-worker cluster (scenarios ``FIRST``)."""
    return run_workers(tmp_path_factory.mktemp("sc_cluster"), FIRST)


@pytest.fixture(scope="session")
def sc_cluster_again(sc_cluster) -> WorkerRun:
    """A second 2-worker cluster in the same directory (scenarios ``SECOND``): the resumed jobs."""
    return run_workers(sc_cluster.out_dir, SECOND)
