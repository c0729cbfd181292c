"""The "gradient" correction and the default correction="auto" against plain-numpy references, for plain
SGD (where gradient == vrl), heavy-ball and Nesterov momentum, and Adam; the bytes it adds."""

import numpy as np
import pytest
import tensorflow as tf

from tests.tf.sc_reference import _NumpyOpt, make_batches, run_gradient_rule, run_rule, softmax_step
from tf_commopt.distribute import SkipCorrectStrategy

R, B, F, C, LR, H, STEPS = 4, 5, 3, 4, 0.1, 3, 8
DEVICES = ["/cpu:%d" % i for i in range(R)]


def _run(correction, make_tf_opt, steps=STEPS, h=H):
    rng = np.random.RandomState(11)
    w0, b0 = rng.randn(F, C).astype(np.float32) * 0.3, rng.randn(C).astype(np.float32) * 0.1
    batches = make_batches(steps, R, B, F, C, seed=12)
    strategy = SkipCorrectStrategy(interval=h, correction=correction, devices=DEVICES)
    with strategy.scope():
        w, b = tf.Variable(w0), tf.Variable(b0)
        opt = make_tf_opt()
    step = softmax_step(strategy, w, b, opt, R * B)
    seen = []
    for row in batches:
        step(row)
        seen.append(
            (
                [c.numpy() for c in w.values],
                [c.numpy() for c in b.values],
                strategy.extended.correction_state(opt).delta_numpy()[0],
            )
        )
    return w0, b0, batches, strategy, opt, seen


def _check(seen, ref):
    for t, ((ws, bs, dw), (rw, rb, rdw)) in enumerate(zip(seen, ref)):
        for i in range(R):
            np.testing.assert_allclose(
                ws[i], rw[i], rtol=2e-5, atol=2e-5, err_msg=f"w step {t + 1} replica {i}"
            )
            np.testing.assert_allclose(bs[i], rb[i], rtol=2e-5, atol=2e-5, err_msg=f"b step {t + 1}")
        np.testing.assert_allclose(dw, np.stack(rdw), rtol=1e-4, atol=1e-4, err_msg=f"delta step {t + 1}")


CASES = {
    "sgd": (lambda: tf.keras.optimizers.SGD(LR), lambda: _NumpyOpt("sgd", LR)),
    "momentum": (lambda: tf.keras.optimizers.SGD(LR, momentum=0.9), lambda: _NumpyOpt("sgd", LR, 0.9)),
    "nesterov": (
        lambda: tf.keras.optimizers.SGD(LR, momentum=0.9, nesterov=True),
        lambda: _NumpyOpt("sgd", LR, 0.9, nesterov=True),
    ),
    "adam": (lambda: tf.keras.optimizers.Adam(0.01), lambda: _NumpyOpt("adam", 0.01)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_correction_matches_numpy(name):
    make_tf, make_np = CASES[name]
    w0, b0, batches, strategy, opt, seen = _run("gradient", make_tf)
    _check(seen, run_gradient_rule(w0, b0, batches, H, make_np))
    st = strategy.stats()
    # the gradient sums double the payload of a sync: (model + sums) x 4 bytes
    assert st["syncs"] == STEPS // H and st["bytes_communicated"] == st["syncs"] * 2 * (F * C + C) * 4


def test_gradient_equals_vrl_for_plain_sgd_and_auto_picks_vrl_there():
    w0, b0, batches, strategy, opt, seen = _run("auto", lambda: tf.keras.optimizers.SGD(LR))
    assert strategy.extended.correction_state(opt).rule == "vrl"
    vrl = run_rule(w0, b0, batches, H, "vrl", LR)
    grad = run_gradient_rule(w0, b0, batches, H, lambda: _NumpyOpt("sgd", LR))
    for (vw, vb, _, _), (gw, gb, _) in zip(vrl, grad):  # the two rules, in numpy, agree
        for i in range(R):
            np.testing.assert_allclose(vw[i], gw[i], rtol=1e-9, atol=1e-9)
            np.testing.assert_allclose(vb[i], gb[i], rtol=1e-9, atol=1e-9)
    _check(seen, grad)
    # no extra bytes for vrl
    assert strategy.stats()["bytes_communicated"] == (STEPS // H) * (F * C + C) * 4


@pytest.mark.parametrize("name", ["momentum", "adam"])
def test_auto_picks_gradient_for_other_optimizers(name):
    make_tf, make_np = CASES[name]
    w0, b0, batches, strategy, opt, seen = _run("auto", make_tf, steps=4)
    assert strategy.extended.correction_state(opt).rule == "gradient"
    _check(seen, run_gradient_rule(w0, b0, batches, H, make_np))


def test_gradient_state_survives_a_checkpoint_mid_interval(tmp_path):
    rng = np.random.RandomState(3)
    w0, b0 = rng.randn(F, C).astype(np.float32) * 0.3, rng.randn(C).astype(np.float32) * 0.1
    batches = make_batches(8, R, B, F, C, seed=4)

    def build():
        # Adam's slots averaged at syncs, so that after strategy.sync() the checkpoint (which stores the
        # replicas' mean of every mirrored variable) holds exactly what every replica has
        strategy = SkipCorrectStrategy(
            interval=H, correction="gradient", devices=DEVICES, average_optimizer_state=True
        )
        with strategy.scope():
            w, b = tf.Variable(w0), tf.Variable(b0)
            opt = tf.keras.optimizers.Adam(0.01)
        return strategy, w, b, opt, softmax_step(strategy, w, b, opt, R * B)

    strategy, w, b, opt, step = build()
    for row in batches[:5]:  # sync after step 3; k = 2 at step 5, G_i != 0
        step(row)
    strategy.sync()  # out of rhythm: the model is global, k and G_i are kept
    sums = [
        s.copy()
        for s in (
            np.stack([c.numpy() for c in g.values]) for g in strategy.extended.correction_state(opt).grad_sums
        )
    ]
    assert np.abs(sums[0]).max() > 0
    path = tf.train.Checkpoint(w=w, b=b, opt=opt).write(str(tmp_path / "ck"))
    for row in batches[5:]:
        step(row)
    want = [c.numpy() for c in w.values], strategy.extended.correction_state(opt).delta_numpy()[0]

    strategy2, w2, b2, opt2, step2 = build()
    step2(batches[0])  # creates the optimizer and correction state ...
    tf.train.Checkpoint(w=w2, b=b2, opt=opt2).read(path).assert_consumed()  # ... which the restore overwrites
    state2 = strategy2.extended.correction_state(opt2)
    np.testing.assert_allclose(np.stack([c.numpy() for c in state2.grad_sums[0].values]), sums[0], rtol=1e-6)
    for row in batches[5:]:
        step2(row)
    for i in range(R):
        np.testing.assert_allclose(w2.values[i].numpy(), want[0][i], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state2.delta_numpy()[0], want[1], rtol=1e-5, atol=1e-6)
