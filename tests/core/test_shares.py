"""Batch shares from measured step times (tf_commopt.core.shares), against brute force."""

import math

import pytest

from tf_commopt.core.shares import equal_time_shares, format_shares
from tf_commopt.errors import InputError


def brute_force(devices, batch):
    """Largest batch in 1..B whose time fits the fastest worker's full-batch time, by trying every batch
    (devices: (fixed seconds, seconds per example) per worker)."""
    target = min(a + c * batch for a, c in devices)
    out = []
    for a, c in devices:
        fits = [b for b in range(1, batch + 1) if a + c * b <= target * (1 + 1e-12)]
        out.append(max(fits) if fits else 1)
    return out


@pytest.mark.parametrize(
    "devices,batch",
    [
        ([(0.01, 1e-3), (0.02, 2e-3)], 128),  # a device 2x slower in both parts: B/2
        ([(0.05, 1e-3), (0.10, 2e-3), (0.05, 1e-3), (0.10, 2e-3)], 128),  # fixed part: less than B/2
        ([(0.0, 1e-3), (0.0, 3e-3)], 96),  # proportional: 1/k exactly
        ([(0.02, 5e-4), (0.01, 8e-4), (0.03, 4e-4)], 64),  # crossing lines
        ([(0.2, 1e-3), (0.01, 1e-3)], 32),  # a fixed part above the target: the smallest batch
    ],
)
def test_shares_give_the_brute_force_batches(devices, batch):
    full = [a + c * batch for a, c in devices]
    half = [a + c * (batch // 2) for a, c in devices]
    shares = equal_time_shares(full, half, batch)
    want = brute_force(devices, batch)
    # the rule's batch is real-valued: it lies within one example of the largest integer batch that fits
    assert [abs(s * batch - w) <= 1.0 + 1e-9 + 0.0005 * batch for s, w in zip(shares, want)] == [True] * len(
        want
    )
    assert max(shares) == 1.0 and shares[full.index(min(full))] == 1.0


def test_unclipped_shares_make_every_step_as_long_as_the_fastest():
    devices, batch = [(0.03, 1e-3), (0.04, 2.5e-3), (0.01, 1.5e-3)], 256
    full = [a + c * batch for a, c in devices]
    half = [a + c * (batch // 2) for a, c in devices]
    shares = equal_time_shares(full, half, batch)
    times = [a + c * s * batch for (a, c), s in zip(devices, shares)]
    assert all(math.isclose(t, min(full), rel_tol=2e-3) for t in times)


def test_a_time_that_does_not_grow_with_the_batch_keeps_the_full_batch():
    # worker 1's half batch measured slower than its full one (noise): no slope, full batch
    assert equal_time_shares([0.1, 0.1], [0.05, 0.12], 64) == (1.0, 1.0)


def test_format_shares_is_the_runner_flag():
    assert format_shares((1.0, 0.375, 0.5)) == "1,0.375,0.5"


@pytest.mark.parametrize(
    "full,half,batch,where",
    [
        ([0.1, -1.0], [0.05, 0.05], 64, "t_full[1]"),
        ([0.1], [float("nan")], 64, "t_half[0]"),
        ([0.1, 0.2], [0.05], 64, "t_half"),
        ([], [], 64, "t_half"),
        ([0.1], [0.05], 1, "batch"),
        ([0.1], [0.05], 64.0, "batch"),
    ],
)
def test_bad_input_is_one_line_naming_the_argument(full, half, batch, where):
    with pytest.raises(InputError) as e:
        equal_time_shares(full, half, batch)
    assert e.value.where == where and "\n" not in str(e.value)
