"""GroupedHybridTrainer on a 2-host TF_CONFIG cluster (one group of 2 logical CPUs per host) through the
launcher: weights broadcast from host 0, throughput-weighted (1 / t_g) uneven batch split, and after two steps both
hosts hold exactly the single-device weights."""

import numpy as np


def test_two_hosts_equal_single_device_training(sc_cluster_again):
    got = sc_cluster_again.results("hybrid")
    for g in got:
        np.testing.assert_array_equal(g["w0"], g["ref_w0"])  # host 1 built other weights: broadcast
        np.testing.assert_allclose(g["losses"], g["ref_losses"], atol=1e-5, rtol=0)
        np.testing.assert_allclose(g["w"], g["ref_w"], atol=1e-5, rtol=0)
    np.testing.assert_array_equal(got[0]["w"], got[1]["w"])
    assert np.abs(got[0]["w"] - got[0]["w0"]).max() > 1e-3  # it trained
