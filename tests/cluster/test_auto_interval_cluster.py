"""interval="auto" on a 2-worker cluster with a capped network: both workers agree on the timings and on
H, H is what the pure policy gives for them, and H > 1 because communication is slow."""

import numpy as np
import pytest

from tf_commopt.core.interval import FirstIterationPolicy


def test_two_workers_agree_on_the_first_iteration_interval(tmp_path, worker_cluster):
    run = worker_cluster(tmp_path, ["auto"], bandwidth_mbit=20, topology="switch")
    stats = run.results("auto")
    a, b = stats
    for s in stats:
        assert s["interval_chosen"] == 1 and s["steps"] == 52
        assert len(s["interval_t_comm_samples_s"]) == 3 and len(s["interval_t_comp_samples_s"]) == 48
        assert s["interval"] == FirstIterationPolicy(max_interval=1000).choose(
            s["interval_t_comm_s"], s["interval_t_comp_s"]
        )
        assert s["interval_overhead_s"] > 0
    assert (a["interval"], a["interval_t_comm_s"], a["interval_t_comp_s"]) == (
        b["interval"],
        b["interval_t_comm_s"],
        b["interval_t_comp_s"],
    )
    # the agreed timings are the mean over the two workers of each worker's sample median
    for key in ("comm", "comp"):
        want = np.mean([np.median(s[f"interval_t_{key}_samples_s"]) for s in stats])
        assert a[f"interval_t_{key}_s"] == pytest.approx(want, rel=1e-4, abs=2e-6)
    # ~2.1 MB of parameters over a 20 Mbit/s link take far longer than a 16-example step
    assert a["interval"] > 2, a
    # steps 1-2 at H = 1, probe syncs after steps 18, 34 and 50 (H = 16, the default probe), then every H
    assert a["syncs"] == 2 + 3 + 2 // a["interval"]
