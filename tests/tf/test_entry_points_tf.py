"""Runner errors found only after TensorFlow is loaded: still one line and exit code 2 (in process)."""

import json

from tests.inprocess import run_module


def test_train_backup_dir_on_a_ps_cluster_without_chief_names_the_cluster_problem():
    # --backup_dir is supported on ps clusters; a ps cluster without a chief is one line naming TF_CONFIG
    cfg = {"cluster": {"worker": ["h:1"], "ps": ["h:2"]}, "task": {"type": "worker", "index": 0}}
    r = run_module(
        "experiments.train", ["--backup_dir=/tmp/unused"], env={"TF_CONFIG": json.dumps(cfg)}, pure=False
    )
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    assert r.err.startswith("experiments.train: error: TF_CONFIG: "), r.err
    assert "needs 'ps' tasks and a 'chief'" in r.err and "backup_dir" not in r.err, r.err
