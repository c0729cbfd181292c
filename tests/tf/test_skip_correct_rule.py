"""SkipCorrectStrategy against a plain-numpy implementation of the rule (custom training loop)."""

import numpy as np
import pytest
import tensorflow as tf

from tests.tf.sc_reference import assert_copies_follow, fresh_mirrored, make_batches, run_rule, softmax_step
from tf_commopt.distribute import SkipCorrectStrategy

R, B, F, C, LR, STEPS = 4, 5, 3, 4, 0.2, 10
DEVICES = ["/cpu:%d" % i for i in range(R)]


def _init():
    rng = np.random.RandomState(7)
    return rng.randn(F, C).astype(np.float32) * 0.3, rng.randn(C).astype(np.float32) * 0.1


def _custom_loop(strategy, batches, w0, b0, on_step, make_opt=None):
    with strategy.scope():
        w = tf.Variable(w0)
        b = tf.Variable(b0)
        opt = (make_opt or tf.keras.optimizers.SGD)(LR)

    step = softmax_step(strategy, w, b, opt, R * B)

    for t, row in enumerate(batches):
        step(row)
        on_step(t, w, b, opt)
    return w, b, opt


@pytest.mark.parametrize("correction", ["none", "vrl"])
@pytest.mark.parametrize("interval", [2, 3, 5])
def test_per_replica_variables_match_numpy_every_step(interval, correction):
    w0, b0 = _init()
    batches = make_batches(STEPS, R, B, F, C, seed=interval)
    ref = run_rule(w0, b0, batches, interval, correction, LR)
    strategy = SkipCorrectStrategy(interval=interval, correction=correction, devices=DEVICES)

    def check(t, w, b, opt):
        rw, rb, rdw, rdb = ref[t]
        assert_copies_follow(w, b, rw, rb, t + 1)
        state = strategy.extended.correction_state(opt)
        if correction == "vrl":
            dw, db = state.delta_numpy()
            np.testing.assert_allclose(dw, np.stack(rdw), rtol=1e-4, atol=1e-4, err_msg=f"delta step {t + 1}")
            np.testing.assert_allclose(db, np.stack(rdb), rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(dw.sum(axis=0), 0.0, atol=1e-4)
            np.testing.assert_allclose(db.sum(axis=0), 0.0, atol=1e-4)
        else:
            assert state.deltas is None

    _custom_loop(strategy, batches, w0, b0, check)
    st = strategy.stats()
    assert st["steps"] == STEPS and st["syncs"] == STEPS // interval and st["interval"] == interval
    assert st["bytes_communicated"] == (STEPS // interval) * (F * C + C) * 4
    # a non-trivial run: the replicas really diverge between syncs when the step count is off-rhythm
    if STEPS % interval:
        last = ref[-1][0]
        assert max(np.abs(last[i] - last[0]).max() for i in range(R)) > 1e-3


def test_legacy_optimizer_follows_the_rule_too():
    w0, b0 = _init()
    batches = make_batches(5, R, B, F, C, seed=13)
    ref = run_rule(w0, b0, batches, 2, "vrl", LR)
    strategy = SkipCorrectStrategy(interval=2, correction="vrl", devices=DEVICES)

    def check(t, w, b, opt):
        for i in range(R):
            np.testing.assert_allclose(
                w.values[i].numpy(), ref[t][0][i], rtol=1e-5, atol=1e-5, err_msg=f"step {t + 1}"
            )

    _custom_loop(strategy, batches, w0, b0, check, make_opt=tf.keras.optimizers.legacy.SGD)
    assert strategy.stats()["syncs"] == 2


def test_momentum_with_local_slots_and_effective_correction_lr():
    w0, b0 = _init()
    batches = make_batches(7, R, B, F, C, seed=19)
    ref = run_rule(w0, b0, batches, 3, "vrl", LR, momentum=0.5, correction_lr="effective")
    strategy = SkipCorrectStrategy(interval=3, correction="vrl", correction_lr="effective", devices=DEVICES)

    def check(t, w, b, opt):
        for i in range(R):
            np.testing.assert_allclose(
                w.values[i].numpy(), ref[t][0][i], rtol=1e-5, atol=1e-5, err_msg=f"step {t + 1}"
            )
        dw, _ = strategy.extended.correction_state(opt).delta_numpy()
        np.testing.assert_allclose(dw, np.stack(ref[t][2]), rtol=1e-4, atol=1e-4)

    _custom_loop(
        strategy, batches, w0, b0, check, make_opt=lambda lr: tf.keras.optimizers.SGD(lr, momentum=0.5)
    )


def test_warmup_is_synchronous_then_local():
    w0, b0 = _init()
    batches = make_batches(8, R, B, F, C, seed=11)
    ref = run_rule(w0, b0, batches, 3, "vrl", LR, warmup_steps=2)
    strategy = SkipCorrectStrategy(interval=3, correction="vrl", warmup_steps=2, devices=DEVICES)

    def check(t, w, b, opt):
        for i in range(R):
            np.testing.assert_allclose(
                w.values[i].numpy(), ref[t][0][i], rtol=1e-5, atol=1e-5, err_msg=f"step {t + 1}"
            )

    _custom_loop(strategy, batches, w0, b0, check)
    # two SSGD steps all-reduce the gradients (w and b), then syncs at t = 5 and t = 8
    st = strategy.stats()
    assert st["syncs"] == 2
    assert st["bytes_communicated"] == 4 * (F * C + C) * 4


def test_interval_one_none_is_ssgd_and_cross_replica_read_is_mean():
    w0, b0 = _init()
    batches = make_batches(4, R, B, F, C, seed=3)
    finals = {}
    for name, strategy in (
        ("sc", SkipCorrectStrategy(interval=1, correction="none", devices=DEVICES)),
        ("mirrored", fresh_mirrored(DEVICES)),
    ):
        w, b, _ = _custom_loop(strategy, batches, w0, b0, lambda *a: None)
        finals[name] = (w.numpy(), b.numpy())
    np.testing.assert_allclose(finals["sc"][0], finals["mirrored"][0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(finals["sc"][1], finals["mirrored"][1], rtol=1e-5, atol=1e-5)
    # mid-interval: the cross-replica read is the mean of the replicas' copies, not replica 0's
    strategy = SkipCorrectStrategy(interval=5, correction="none", devices=DEVICES)
    w, _, _ = _custom_loop(strategy, batches[:2], w0, b0, lambda *a: None)
    comps = np.stack([c.numpy() for c in w.values])
    assert np.abs(comps[1] - comps[0]).max() > 1e-4
    np.testing.assert_allclose(w.numpy(), comps.mean(axis=0), rtol=1e-6, atol=1e-6)
    strategy.sync()
    for c in w.values:
        np.testing.assert_allclose(c.numpy(), comps.mean(axis=0), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("compression", [None, "bf16"])
def test_sync_sends_nothing_when_the_replicas_hold_the_global_model(compression):
    w0, b0 = _init()
    batches = make_batches(7, R, B, F, C, seed=5)
    ref = run_rule(w0, b0, batches[:6], 3, "vrl", LR)
    strategy = SkipCorrectStrategy(interval=3, correction="vrl", compression=compression, devices=DEVICES)
    w, b, opt = _custom_loop(strategy, batches[:6], w0, b0, lambda *a: None)
    before = strategy.stats()
    assert before["syncs"] == 2 and strategy.extended.replicas_equal()
    strategy.sync()  # the last step was a scheduled sync: every copy is already the global model
    after = strategy.stats()
    assert (after["syncs"], after["bytes_communicated"]) == (before["syncs"], before["bytes_communicated"])
    if compression is None:
        assert_copies_follow(w, b, ref[-1][0], ref[-1][1], 6)
    comps = np.stack([c.numpy() for c in w.values])
    np.testing.assert_array_equal(comps, np.broadcast_to(comps[0], comps.shape))
    step = softmax_step(strategy, w, b, opt, R * B)
    step(batches[6])  # one local step: the copies differ, so sync() averages them
    assert not strategy.extended.replicas_equal()
    comps = np.stack([c.numpy() for c in w.values])
    assert np.abs(comps[1] - comps[0]).max() > 1e-5
    strategy.sync()
    assert strategy.stats()["syncs"] == before["syncs"] + 1
    for c in w.values:
        np.testing.assert_allclose(c.numpy(), comps.mean(axis=0), rtol=1e-6, atol=1e-6)
