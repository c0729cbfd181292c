"""SkipCorrectStrategy on a 2-worker TF_CONFIG cluster (MultiWorkerMirroredStrategy machinery) through
the launcher: each worker's copy after every step equals the plain-numpy rule; model.fit/evaluate run;
a checkpoint saved mid-interval is restored exactly by a new cluster."""

import numpy as np

from tests.cluster.workers import assert_steps_follow
from tests.tf.sc_reference import make_batches, run_rule


def test_two_workers_follow_the_numpy_rule(sc_cluster):
    got = sc_cluster.results("sc")
    rng = np.random.RandomState(7)
    w0, b0 = rng.randn(3, 4).astype(np.float32) * 0.3, rng.randn(4).astype(np.float32) * 0.1
    ref = run_rule(w0, b0, make_batches(7, 2, 5, 3, 4, seed=17), 3, "vrl", 0.2)
    assert_steps_follow(got, ref, 7)
    assert abs(ref[-1][0][0] - ref[-1][0][1]).max() > 1e-3  # step 7 is local: the workers differ
    for g in got:
        assert int(g["syncs"]) == 2 and int(g["bytes"]) == 2 * (3 * 4 + 4) * 4
    # the checkpoint holds every worker's Δ stacked in replica order
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(sc_cluster.out_dir / "ckpt0" / "ckpt"))
    keys = {k for k in reader.get_variable_to_shape_map() if "skip_correct_state" in k}
    delta_key = [k for k in keys if k.endswith("delta_0")]
    assert len(delta_key) == 1, keys
    np.testing.assert_allclose(
        reader.get_tensor(delta_key[0]), np.stack([g["d"][-1] for g in got]), atol=1e-6
    )
    assert int(reader.get_tensor([k for k in keys if k.endswith("num_replicas")][0])) == 2
    # after evaluate (which averages first) both workers hold the same global model and the same loss
    np.testing.assert_allclose(got[0]["kernel_after_eval"], got[1]["kernel_after_eval"], rtol=1e-6, atol=1e-6)
    assert float(got[0]["loss"]) == float(got[1]["loss"]) > 0


def test_two_workers_save_mid_interval_and_a_new_cluster_restores_exactly(sc_cluster, sc_cluster_again):
    # H = 3: save after 4 steps (k = 1), continue to step 10 (syncs after steps 6 and 9; step 10 is local)
    first = sc_cluster.results("restore:first")
    resumed = sc_cluster_again.results("restore:resume")
    d_saved = [first[i]["d_saved"] for i in range(2)]
    assert np.abs(d_saved[0]).max() > 1e-3 and np.abs(d_saved[0] - d_saved[1]).max() > 1e-3
    for i in range(2):
        # step 5 is local (no Δ update): worker i's Δ is its own saved row, not the other worker's
        np.testing.assert_allclose(
            resumed[i]["d"][0], d_saved[i], rtol=1e-5, atol=1e-6, err_msg=f"worker {i}"
        )
        for key in ("w", "b", "d"):  # every step after the restore equals the uninterrupted run
            np.testing.assert_allclose(
                resumed[i][key], first[i][key], rtol=1e-5, atol=1e-5, err_msg=f"{key}{i}"
            )
        assert int(resumed[i]["iterations"]) == int(first[i]["iterations"]) == 10
        assert int(resumed[i]["syncs"]) == 2
    assert np.abs(first[0]["w"][-1] - first[1]["w"][-1]).max() > 1e-4  # step 10 is local: the workers differ
