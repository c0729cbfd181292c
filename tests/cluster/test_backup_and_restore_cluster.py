"""tf.keras.callbacks.BackupAndRestore under SkipCorrectStrategy on a 2-worker cluster, as with
MultiWorkerMirroredStrategy: a job preempted at an epoch start and re-run by a new cluster ends with every
worker's copy equal to the uninterrupted job's (backups mid-interval: k ≠ 0, Δ_i ≠ 0)."""

import os
import sys

import numpy as np
import pytest

from tf_commopt.cluster import run_cluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "cluster", "_sc_backup_worker.py")


def _cluster(tmp_path, backup, mode, optimizer):
    r = run_cluster(
        [sys.executable, WORKER, str(tmp_path), str(backup), mode, optimizer],
        workers=2,
        timeout=400,
        env={"TF_CPP_MIN_LOG_LEVEL": "2"},
        cwd=ROOT,
        echo=False,
    )
    tail = "\n".join(f"[{t}] {line}" for t in r.outputs for line in r.last_lines(t, 20))
    assert r.returncode == 0, f"{mode}: {r.message}\n{tail}"
    return [dict(np.load(str(tmp_path / f"{mode}{i}.npz"))) for i in range(2)]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_preempted_job_resumed_by_a_new_cluster_equals_the_uninterrupted_job(tmp_path, optimizer):
    whole = _cluster(tmp_path, tmp_path / "backup_whole", "whole", optimizer)
    cut = _cluster(tmp_path, tmp_path / "backup", "interrupt", optimizer)
    assert sorted(os.listdir(tmp_path / "backup")) == ["chief"]  # workers' temporary copies removed
    resumed = _cluster(tmp_path, tmp_path / "backup", "resume", optimizer)
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
    assert not os.path.exists(tmp_path / "backup" / "chief")  # deleted after the successful fit
