"""The closed-form epoch times of tf_commopt.core.scaling (used for the 8 ... 1024-worker extrapolation in
docs/results/comm.md) agree with the event simulator on the same costs."""

import math

import pytest

from tf_commopt.core.costgraph import CostGraph, Node
from tf_commopt.core.devices import Cluster
from tf_commopt.core.scaling import epoch_time_s, ring_allreduce_s, scaling_table
from tf_commopt.core.simulate.dataparallel import simulate_data_parallel, simulate_local_sgd


@pytest.mark.parametrize("workers", [8, 64, 1024])
@pytest.mark.parametrize("interval", [1, 3, 16])
def test_closed_form_matches_the_simulator(workers, interval):
    t_comp_ms, nbytes, gbps, lat_ms = 120.0, 40e6, 1.0, 0.05
    g = CostGraph([Node("model", t_comp_ms / 3, 2 * t_comp_ms / 3, param_bytes=nbytes)], [])
    cluster = Cluster.homogeneous(workers, bandwidth_gbps=gbps, latency_ms=lat_ms)
    ring = ring_allreduce_s(nbytes, workers, bandwidth_mbit=1000 * gbps, latency_s=lat_ms / 1000)
    # full per-worker batches: each worker computes the whole profiled step
    if interval == 1:
        sim = simulate_data_parallel(g, cluster, batch_fractions=[1.0] * workers).iteration_ms
    else:
        sim = simulate_local_sgd(g, cluster, interval, batch_fractions=[1.0] * workers).iteration_ms
    closed = epoch_time_s(interval, t_comp_ms / 1000, ring, interval) / interval  # one period, per step
    assert sim / 1000 == pytest.approx(closed, rel=1e-9)


def test_scaling_table_picks_the_thesis_interval_and_never_loses():
    rows = scaling_table([8, 1024], 40e6, 0.1, 60000, 32, bandwidth_mbit=1000, latency_s=50e-6)
    for r in rows:
        want = max(1, min(256, math.floor(r["allreduce_s"] / 0.1 + 0.5)))
        assert r["interval"] == want
        assert r["skip_correct_epoch_s"] <= r["ssgd_epoch_s"]
        assert r["skip_correct_epoch_s"] >= r["compute_only_epoch_s"]
