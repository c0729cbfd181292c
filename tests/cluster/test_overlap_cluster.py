"""SkipCorrectStrategy(overlap=True) on a 2-worker TF_CONFIG cluster: the background all-reduce runs over
real collectives between processes, and each worker's copy after every step (and after ``strategy.sync()``)
equals the plain-numpy overlapped rule; ``model.fit`` drains at its end and ``evaluate`` sees the global model."""

import numpy as np

from tests.cluster.workers import assert_steps_follow
from tests.tf.sc_reference import make_batches, run_overlap_rule


def test_two_workers_follow_the_numpy_overlap_rule(sc_cluster):
    got = sc_cluster.results("overlap")
    rng = np.random.RandomState(7)
    w0, b0 = rng.randn(3, 4).astype(np.float32) * 0.3, rng.randn(4).astype(np.float32) * 0.1
    steps = 8
    ref = run_overlap_rule(w0, b0, make_batches(steps, 2, 5, 3, 4, seed=17), 3, "vrl", 0.2)
    # after the loop: strategy.sync() = apply the mean in flight since step 6, then average (no Δ update)
    after = run_overlap_rule(
        w0, b0, make_batches(steps, 2, 5, 3, 4, seed=17), 3, "vrl", 0.2, sync_after=(steps,)
    )
    ref = ref + [after[-1]]
    assert_steps_follow(got, ref, steps + 1)
    assert np.abs(ref[6][2][0]).max() > 1e-3  # the Δ update at step 6 used the stale (step 3) snapshot
    assert abs(ref[steps - 1][0][0] - ref[steps - 1][0][1]).max() > 1e-3  # before the sync the workers differ
    np.testing.assert_allclose(got[0]["w"][-1], got[1]["w"][-1], rtol=1e-6, atol=1e-6)
    for g in got:
        # 2 background all-reduces + the sync's blocking one
        assert int(g["syncs"]) == 3 and int(g["bytes"]) == 3 * (3 * 4 + 4) * 4 and float(g["background"]) > 0
        assert int(g["pending"]) == 0
    np.testing.assert_allclose(got[0]["kernel_after_eval"], got[1]["kernel_after_eval"], rtol=1e-6, atol=1e-6)
    assert float(got[0]["loss"]) == float(got[1]["loss"]) > 0


def test_eager_reductions_beside_the_background_all_reduce_keep_their_own_keys(sc_cluster):
    """Each worker draws the background all-reduce's keys and an eager reduction's in the opposite order
    (tests/cluster/_worker.py ``overlap_race``): both still pair with their own, so every eager sum is
    exact and the model after strategy.sync() is the numpy overlap rule's."""
    got = sc_cluster.results("overlap_race")
    steps = 9
    rng = np.random.RandomState(7)
    w0, b0 = rng.randn(3, 4).astype(np.float32) * 0.3, rng.randn(4).astype(np.float32) * 0.1
    after = run_overlap_rule(
        w0, b0, make_batches(steps, 2, 5, 3, 4, seed=17), 3, "vrl", 0.2, sync_after=(steps,)
    )
    for task, g in enumerate(got):
        assert np.array_equal(np.asarray(g["sums"]), np.full((steps - 1, 3 * 4 + 4), 3.0, np.float32))
        np.testing.assert_allclose(g["w"], after[-1][0][task], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(g["b"], after[-1][1][task], rtol=1e-5, atol=1e-6)
