"""The two-level interval policy (tf_commopt.core.levels) and the closed-form estimate (core.sync_cost).

The policy: its degenerate cases, its global interval against AutoInterval's on a grid, its validation.
The estimate: the flat sync against scaling.ring_allreduce_s (written separately), compression halving
bytes and communication, sync counts, one worker per host = a flat ring over the hosts; the entry point.
"""

import dataclasses
import itertools

import pytest

from tests.inprocess import run_module
from tf_commopt.core import scaling, sync_cost
from tf_commopt.core.levels import TwoLevelInterval
from tf_commopt.distribute.interval_policy import AutoInterval
from tf_commopt.errors import InputError


# ------------------------------------------------------------------------------------------- policy
def test_free_intra_host_sync_averages_within_the_host_every_step():
    h, m = TwoLevelInterval().choose(t_intra_s=0.0, t_inter_s=0.54, t_comp_s=0.05)
    assert (h, m) == (1, AutoInterval().choose(0.54, 0.05)) == (1, 11)


def test_one_host_is_plain_h_from_its_only_link():
    assert TwoLevelInterval().choose(0.02, 99.0, 0.01, hosts=1) == (20, 1)  # round(0.02 / (0.1 * 0.01))
    assert TwoLevelInterval(intra_ratio=1.0).choose(0.54, 99.0, 0.05, hosts=1) == (
        AutoInterval().choose(0.54, 0.05),
        1,
    )


def test_an_intra_host_sync_no_faster_than_the_global_one_is_one_level():
    assert TwoLevelInterval().choose(0.5, 0.5, 0.02) == (25, 1)
    assert TwoLevelInterval(intra_ratio=1.0).choose(0.5, 0.5, 0.02) == (25, 1)


@pytest.mark.parametrize("ratio,intra_ratio,cap", [(1.0, 0.1, 256), (0.5, 1.0, 64), (2.0, 0.05, 16)])
def test_the_global_interval_is_the_multiple_of_h_nearest_autointervals(ratio, intra_ratio, cap):
    policy = TwoLevelInterval(target_ratio=ratio, intra_ratio=intra_ratio, max_interval=cap)
    auto = AutoInterval(target_ratio=ratio, max_interval=cap)
    times = [0.0, 0.001, 0.004, 0.013, 0.05, 0.2, 1.0, 7.0]
    for t_intra, t_inter, t_comp in itertools.product(times, times, [0.002, 0.02, 0.121]):
        h, m = policy.choose(t_intra, t_inter, t_comp)
        big_h = auto.choose(t_inter, t_comp)
        h0 = policy.intra_interval(t_intra, t_comp)
        assert 1 <= h <= min(h0, big_h) and m >= 1 and m * h <= cap
        best = min(abs(k * h - big_h) for k in range(1, cap // h + 1))
        assert abs(m * h - big_h) == best, (t_intra, t_inter, t_comp, h, m, big_h)


@pytest.mark.parametrize(
    "call,message",
    [
        (
            lambda: TwoLevelInterval(target_ratio=0.0),
            "TwoLevelInterval(target_ratio=...): must be a finite number > 0",
        ),
        (lambda: TwoLevelInterval(intra_ratio=float("nan")), "TwoLevelInterval(intra_ratio=...): must be"),
        (
            lambda: TwoLevelInterval(max_interval=0),
            "TwoLevelInterval(max_interval=...): must be an integer >= 1",
        ),
        (
            lambda: TwoLevelInterval().choose(-1.0, 1.0, 1.0),
            "t_intra_s: must be a finite number of seconds >= 0",
        ),
        (lambda: TwoLevelInterval().choose(1.0, "x", 1.0), "t_inter_s: must be"),
        (lambda: TwoLevelInterval().choose(1.0, 1.0, float("inf")), "t_comp_s: must be"),
        (lambda: TwoLevelInterval().choose(1.0, 1.0, 1.0, hosts=0), "hosts: must be an integer >= 1"),
    ],
)
def test_bad_input_is_one_line_naming_the_field(call, message):
    with pytest.raises(InputError) as e:
        call()
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_the_policy_is_a_frozen_value():
    policy = TwoLevelInterval(max_interval=32)
    assert policy == TwoLevelInterval(max_interval=32) and "intra_ratio=0.1" in repr(policy)
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.max_interval = 8


# ----------------------------------------------------------------------------------------- estimate
@pytest.mark.parametrize("workers,mbit,lat", [(2, 100.0, 0.0), (4, 100.0, 0.001), (8, 1000.0, 0.0005)])
def test_flat_sync_is_the_ring_bound(workers, mbit, lat):
    want = scaling.ring_allreduce_s(40.08e6, workers, mbit, latency_s=lat, topology="switch")
    assert sync_cost.flat_sync_s(40.08e6, workers, mbit, None, lat) == pytest.approx(want, rel=1e-12)


def test_compression_halves_the_slow_link_and_one_worker_per_host_is_a_flat_ring():
    for h in (None, 2):
        fp32 = sync_cost.estimate(40.08e6, 0.1, 240, 8, 100.0, h=h)
        bf16 = sync_cost.estimate(40.08e6, 0.1, 240, 8, 100.0, h=h, compression="bf16", intra_mbit=1e12)
        assert bf16["slow_link_mb"] * 2 == pytest.approx(fp32["slow_link_mb"], rel=1e-12)
    flat = sync_cost.flat_sync_s(1e6, 4, 100.0)
    assert sync_cost.two_level_sync_s(1e6, 4, 1, 100.0, 1e4) == pytest.approx(flat, rel=1e-12)


def test_sync_counts_bytes_and_wall_time_of_one_run():
    b, t_comp = 40.08e6, 0.121
    row = sync_cost.estimate(b, t_comp, steps=240, interval=8, inter_mbit=100.0, h=2, intra_mbit=10_000.0)
    assert (row["global_syncs"], row["intra_syncs"]) == (30, 90)
    t_intra = 2 * (b / 2) * 8 / 1e10  # 2 workers: reduce-scatter + all-gather of half the model each
    t_global = t_intra + 2 * (b / 2) * 8 / 1e8  # 2 hosts: the same across the slow link
    assert row["wall_s"] == pytest.approx(240 * t_comp + 30 * t_global + 90 * t_intra, rel=1e-12)
    assert row["slow_link_mb"] == pytest.approx(30 * b / 1e6, rel=1e-12)
    flat = sync_cost.estimate(b, t_comp, steps=240, interval=8, inter_mbit=100.0)
    assert flat["slow_link_mb"] == pytest.approx(30 * 1.5 * b / 1e6, rel=1e-12)
    rows = sync_cost.compare(b, t_comp, 240, 8, 2, 100.0)
    assert [r["variant"] for r in rows] == ["flat", "compressed", "two-level", "both"]
    assert rows[3]["bytes_ratio"] == pytest.approx(1 / 3, rel=1e-12)


@pytest.mark.parametrize(
    "call,message",
    [
        (
            lambda: sync_cost.estimate(1e6, 0.1, 10, 4, 100.0, h=3),
            "h: the global interval 4 is not a multiple",
        ),
        (lambda: sync_cost.estimate(1e6, 0.1, 10, 4, 100.0, workers=3), "hosts: 3 workers do not split"),
        (lambda: sync_cost.estimate(0.0, 0.1, 10, 4, 100.0), "model_bytes: must be a finite number > 0"),
        (lambda: sync_cost.estimate(1e6, 0.1, 10, 0, 100.0), "interval: must be an integer >= 1"),
        (lambda: sync_cost.estimate(1e6, 0.1, 10, 4, 100.0, compression="int4"), "compression: must be"),
        (lambda: sync_cost.estimate(1e6, 0.1, 10, 4, 100.0, compression="int8"), "compression: 'int8' needs"),
    ],
)
def test_estimate_bad_input(call, message):
    with pytest.raises(InputError) as e:
        call()
    assert str(e.value).startswith(message)


def test_the_entry_point_prints_the_prediction_and_rejects_bad_flags():
    r = run_module(
        "experiments.cheapsync_estimate", ["--models=big_mlp:40.08:121", "--inter_mbit=100", "--intervals=8"]
    )
    assert r.code == 0, r.err
    assert "not a measurement" in r.out
    assert "| big_mlp | 100 | 8 | 2 | both | 81.0 | 51.9 | 601.2 | 0.47 | 0.33 |" in r.out
    for bad, needle in (
        ("--models=x:1", "--models"),
        ("--intervals=0", "--intervals"),
        ("--hosts=3", "--hosts"),
    ):
        r = run_module("experiments.cheapsync_estimate", [bad])
        assert r.code == 2 and needle in r.err and r.err.count("\n") == 1, r.err


def test_int8_across_two_hosts_is_an_all_gather_of_a_quarter_and_its_scales():
    """2 hosts: bf16's all-reduce moves 2·(1/2)·M/2 bytes per link, int8's all-gather (1/2)·2·M/4·(1 + 4/256)."""
    m, mbit = 40e6, 100.0
    kw = dict(hosts=2, per_host=2, inter_mbit=mbit, intra_mbit=1e9)
    bf16 = sync_cost.two_level_sync_s(m, compression="bf16", **kw)
    int8 = sync_cost.two_level_sync_s(m, compression="int8", **kw)
    intra = sync_cost.intra_sync_s(m, 2, 1e9)
    assert bf16 - intra == pytest.approx(m / 2 * 8 / (mbit * 1e6), rel=1e-12)
    assert int8 - intra == pytest.approx(m / 4 * (1 + 4 / 256) * 8 / (mbit * 1e6), rel=1e-12)
    run = sync_cost.estimate(m, 0.1, 8, 4, mbit, workers=4, hosts=2, compression="int8", h=4)
    assert run["slow_link_mb"] == pytest.approx(2 * m / 4 * (1 + 4 / 256) / 1e6, rel=1e-12)
