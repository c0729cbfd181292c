"""GroupedHybridTrainer on a 2-host TF_CONFIG cluster (one group of 2 logical CPUs per host) through the
launcher: weights broadcast from host 0, throughput-weighted (1 / t_g) uneven batch split, and after two steps both
hosts hold exactly the single-device weights."""

import os
import sys

import numpy as np

from tf_commopt.cluster import run_cluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_two_hosts_equal_single_device_training(tmp_path):
    r = run_cluster(
        [sys.executable, os.path.join(ROOT, "tests", "cluster", "_hybrid_worker.py"), str(tmp_path)],
        workers=2,
        timeout=300,
        env={"TF_CPP_MIN_LOG_LEVEL": "2"},
        cwd=ROOT,
        echo=False,
    )
    tail = "\n".join(f"[{t}] {line}" for t in r.outputs for line in r.last_lines(t, 20))
    assert r.returncode == 0, f"{r.message}\n{tail}"
    got = [np.load(str(tmp_path / f"worker{i}.npz")) for i in range(2)]
    for g in got:
        np.testing.assert_array_equal(g["w0"], g["ref_w0"])  # host 1 built other weights: broadcast
        np.testing.assert_allclose(g["losses"], g["ref_losses"], atol=1e-5, rtol=0)
        np.testing.assert_allclose(g["w"], g["ref_w"], atol=1e-5, rtol=0)
    np.testing.assert_array_equal(got[0]["w"], got[1]["w"])
    assert np.abs(got[0]["w"] - got[0]["w0"]).max() > 1e-3  # it trained
