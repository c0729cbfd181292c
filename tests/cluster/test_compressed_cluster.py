"""compression="bf16" on a real 2-worker cluster: the steps follow local SGD with the compressed sync of
tf_commopt.core.compress (float64 reference; bf16 rounding of the same deltas), the workers hold the same
bits after every sync, the residuals are kept, and a sync moves half the bytes; with overlap=True each
sync's compressed mean lands one sync later (x_i += x̄ − y_i), and fit runs with it."""

import numpy as np

from tests.tf.sc_reference import make_batches, softmax_grads
from tf_commopt.core import compress

R, B, F, C, LR, H, STEPS = 2, 5, 3, 4, 0.2, 3, 7


def _reference(overlap=False):
    rng = np.random.RandomState(7)
    w0, b0 = rng.randn(F, C).astype(np.float32) * 0.3, rng.randn(C).astype(np.float32) * 0.1
    batches = make_batches(STEPS, R, B, F, C, seed=17)
    x = [np.concatenate([w0.ravel(), b0]).astype(np.float64) for _ in range(R)]
    x0, e, out, k, ys = x[0].copy(), None, [], 0, None
    d = [np.zeros_like(x0) for _ in range(R)]
    for row in batches:
        for i in range(R):
            gw, gb = softmax_grads(x[i][: F * C].reshape(F, C), x[i][F * C :], *row[i])
            x[i] = x[i] - LR * (np.concatenate([gw.ravel(), gb]) - d[i])
        k += 1
        if k == H and overlap:  # the previous snapshots' mean lands, the progress since is kept
            if ys is not None:
                s = compress.compressed_sync(x0, ys, "vrl", H, LR, d, e, codec="bf16", reduce="wire")
                x = [xi + (s.x - yi) for xi, yi in zip(x, ys)]
                x0, d, e = s.x, s.deltas, s.residuals
            ys, k = [xi.copy() for xi in x], 0
        elif k == H:
            s = compress.compressed_sync(x0, x, "vrl", H, LR, d, e, codec="bf16", reduce="wire")
            x, x0, d, e, k = [s.x.copy() for _ in range(R)], s.x, s.deltas, s.residuals, 0
        out.append(([xi.copy() for xi in x], [di.copy() for di in d]))
    return out


def test_two_workers_follow_the_compressed_rule(sc_cluster):
    got = sc_cluster.results("compressed")
    ref = _reference()
    for t in range(STEPS):
        for i, g in enumerate(got):
            w = np.concatenate([g["w"][t].ravel(), g["b"][t]])
            np.testing.assert_allclose(w, ref[t][0][i], atol=2e-3, err_msg=f"step {t + 1} worker {i}")
            np.testing.assert_allclose(g["d"][t].ravel(), ref[t][1][i][: F * C], atol=2e-2)
    for t in (H - 1, 2 * H - 1):  # after a sync: the same bits on both workers, residuals kept
        np.testing.assert_array_equal(got[0]["w"][t], got[1]["w"][t])
        assert np.abs(got[0]["e"][t]).max() > 0
    for g in got:
        assert int(g["syncs"]) == 2 and int(g["payload"]) == (F * C + C) * 2
        assert int(g["bytes"]) == 2 * (F * C + C) * 2  # half of float32's 2 * 16 * 4
        assert int(g["fit_syncs"]) > 2 and np.isfinite(g["loss"])


def test_two_workers_follow_the_compressed_overlapped_rule(sc_cluster):
    got = sc_cluster.results("compressed_overlap")
    ref = _reference(overlap=True)
    for t in range(STEPS):
        for i, g in enumerate(got):
            w = np.concatenate([g["w"][t].ravel(), g["b"][t]])
            np.testing.assert_allclose(w, ref[t][0][i], atol=2e-3, err_msg=f"step {t + 1} worker {i}")
            np.testing.assert_allclose(g["d"][t].ravel(), ref[t][1][i][: F * C], atol=2e-2)
    assert not np.array_equal(got[0]["w"][2 * H - 1], got[1]["w"][2 * H - 1])  # the mean lands a sync late
    assert np.abs(got[0]["e"][2 * H - 1]).max() > 0  # the first mean's residuals, applied at step 2H
    for g in got:
        assert int(g["syncs"]) == 2 and int(g["payload"]) == (F * C + C) * 2
        assert int(g["bytes"]) == 2 * (F * C + C) * 2
        assert int(g["fit_syncs"]) > 2 and np.isfinite(g["loss"])
