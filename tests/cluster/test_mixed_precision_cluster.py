"""mixed_float16 with dynamic loss scaling under SkipCorrectStrategy on a 2-worker cluster: model.fit
follows the numpy rule (to float16 accuracy), the workers differ between syncs (no per-step gradient
all-reduce), and the syncs and bytes are those of float32 training."""

import numpy as np

from tests.tf.sc_reference import make_batches, run_rule


def test_two_workers_mixed_float16_follow_the_rule(sc_cluster):
    got = sc_cluster.results("mixed")
    rng = np.random.RandomState(7)
    w0, b0 = rng.randn(3, 4).astype(np.float32) * 0.3, rng.randn(4).astype(np.float32) * 0.1
    ref = run_rule(w0, b0, make_batches(7, 2, 5, 3, 4, seed=17), 3, "vrl", 0.2)
    assert np.abs(ref[-1][0][0] - ref[-1][0][1]).max() > 1e-2  # step 7 is local: the workers differ
    for i, g in enumerate(got):
        assert str(g["compute_dtype"]) == "float16"
        assert int(g["steps"]) == int(g["iterations"]) == 7 and int(g["syncs"]) == 2
        assert int(g["bytes"]) == 2 * (3 * 4 + 4) * 4
        np.testing.assert_allclose(g["w"], ref[-1][0][i], rtol=0, atol=5e-3, err_msg=f"worker {i}")
        np.testing.assert_allclose(g["b"], ref[-1][1][i], rtol=0, atol=5e-3)
        np.testing.assert_allclose(g["d"], ref[-1][2][i], rtol=0, atol=2e-2)
