"""tf.keras.callbacks.BackupAndRestore under SkipCorrectStrategy on a 2-worker cluster, as with
MultiWorkerMirroredStrategy: a job preempted at an epoch start and re-run by a new cluster ends with every
worker's copy equal to the uninterrupted job's (backups mid-interval: k ≠ 0, Δ_i ≠ 0)."""

import numpy as np
import pytest


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_preempted_job_resumed_by_a_new_cluster_equals_the_uninterrupted_job(
    sc_cluster, sc_cluster_again, optimizer
):
    whole = sc_cluster.results(f"backup:whole:{optimizer}")
    cut = sc_cluster.results(f"backup:interrupt:{optimizer}")
    resumed = sc_cluster_again.results(f"backup:resume:{optimizer}")
    backup = f"backup_{optimizer}/"
    left = [f[len(backup) :] for f in sc_cluster.files if f.startswith(backup) and f != backup]
    assert [f for f in left if "/" not in f[:-1]] == ["chief/"], left  # workers' temporary copies removed
    steps_per_epoch = int(cut[0]["iterations"]) // 2
    assert steps_per_epoch % 3 != 0  # the epoch-end backups are mid-interval (k != 0)
    assert str(whole[0]["rule"]) == ("vrl" if optimizer == "sgd" else "gradient")
    for i in range(2):
        assert int(cut[i]["local_steps"]) != 0 and np.abs(cut[i]["delta"]).max() > 1e-3
        assert int(resumed[i]["epochs_run"]) == 2  # epochs 2 and 3 only
        assert int(resumed[i]["iterations"]) == int(whole[i]["iterations"]) == 4 * steps_per_epoch
        assert int(resumed[i]["local_steps"]) == int(whole[i]["local_steps"])
        for key in ("kernel", "bias", "delta"):
            np.testing.assert_allclose(
                resumed[i][key], whole[i][key], rtol=1e-5, atol=1e-5, err_msg=f"{key}{i}"
            )
    # each worker restored its own Δ row (they differ), and every backup averaged first: after the last
    # epoch's backup both workers hold the same global model
    assert np.abs(whole[0]["delta"] - whole[1]["delta"]).max() > 1e-3
    np.testing.assert_array_equal(whole[0]["kernel"], whole[1]["kernel"])
    assert not (sc_cluster.out_dir / backup / "chief").exists()  # deleted after the successful fit
