"""period="time" on a real 2-worker cluster: the graph loop skips a worker's idle steps (it reads fewer
batches) and the result is the numpy rule's; with worker 1 slowed 4x and measured times it takes fewer
steps per period."""

import numpy as np

from tests.tf.sc_reference import _NumpyOpt, arrange_real_batches, make_batches, run_time_rule

R, B, F, C, LR = 2, 5, 3, 4, 0.2


def _initial_weights():
    rng = np.random.RandomState(7)
    return rng.randn(F, C).astype(np.float32) * 0.3, rng.randn(C).astype(np.float32) * 0.1


def test_two_workers_with_different_counts(sc_cluster):
    got = sc_cluster.results("timeperiod")
    h, steps, counts = 4, 12, (4, 2)
    own = make_batches(steps, R, B, F, C, seed=23)
    rows = arrange_real_batches([[row[i] for row in own] for i in range(R)], h, counts, steps)
    w0, b0 = _initial_weights()
    ref, _ = run_time_rule(w0, b0, rows, h, counts, "vrl", lambda: _NumpyOpt("sgd", LR), LR)
    for i, g in enumerate(got):
        e = g["exact"]
        assert e["steps"] == steps and e["syncs"] == 3 and e["iterations"] == steps
        assert e["period_steps"] == [4, 2] and e["real_steps"] == [3 * counts[i]]
        np.testing.assert_allclose(e["w"], ref[-1][0][i], rtol=1e-5, atol=1e-5, err_msg=f"worker {i}")
        np.testing.assert_allclose(e["b"], ref[-1][1][i], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(e["d"], ref[-1][2][i], rtol=1e-4, atol=1e-4)
    # measured: both workers hold the same table and counts; the slowed worker takes fewer steps
    fast, slow = (g["measured"] for g in got)
    assert fast["period_steps"] == slow["period_steps"] and fast["syncs"] == slow["syncs"] == 6
    assert np.array_equal(fast["period_step_times_s"], slow["period_step_times_s"])
    times = fast["period_step_times_s"]
    assert times[1] > times[0] and fast["period_steps"][0] == 8 and fast["period_steps"][1] < 8, fast
    assert slow["real_steps"][0] < fast["real_steps"][0] == 48, (slow, fast)
    np.testing.assert_array_equal(fast["kernel"], slow["kernel"])  # the fit ends at a sync
