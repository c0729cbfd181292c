"""Runner errors found only after TensorFlow is loaded: still one line and exit code 2 (in process)."""

import json

import numpy as np

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


def test_a_profile_of_random_bytes_is_one_line_exit_2(tmp_path):
    """A profile that is neither graph.txt nor JSON is tried as a model file (TensorFlow), then refused."""
    junk = tmp_path / "junk.bin"
    junk.write_bytes(np.random.RandomState(0).bytes(512))
    plan = tmp_path / "plan.json"
    text = "n0 -- L -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=1\n"
    (tmp_path / "g.txt").write_text(text)
    r = run_module(
        "tf_commopt.partition",
        ["--profile", str(tmp_path / "g.txt"), "--stages", "1", "--out", str(plan), "--quiet"],
        pure=False,
    )
    assert r.code == 0, r.err
    for module, argv in (
        ("tf_commopt.partition", ["--profile", str(junk), "--stages", "2"]),
        (
            "tf_commopt.sim",
            ["--profile", str(junk), "--plan", str(plan), "--schedule", "1f1b", "--microbatches", "2"],
        ),
    ):
        r = run_module(module, argv, pure=False)
        assert r.code == 2 and r.out == "" and r.err.count("\n") == 1 and "Traceback" not in r.err, r.err
