"""SkipCorrectStrategy(overlap=True) against a plain-numpy implementation of the overlapped rule
(tests/tf/sc_reference.run_overlap_rule): custom loops (none, vrl, gradient with momentum, a
``strategy.sync()`` mid-run) and ``model.fit`` (the end of fit applies the in-flight mean)."""

import numpy as np
import pytest
import tensorflow as tf

from tests.tf.sc_reference import (
    _NumpyOpt,
    assert_copies_follow,
    make_batches,
    run_overlap_rule,
    softmax_step,
)
from tf_commopt.distribute import SkipCorrectStrategy
from tf_commopt.errors import InputError

R, B, F, C, LR = 4, 5, 3, 4, 0.2
DEVICES = ["/cpu:%d" % i for i in range(R)]


def _init(seed=7):
    rng = np.random.RandomState(seed)
    return rng.randn(F, C).astype(np.float32) * 0.3, rng.randn(C).astype(np.float32) * 0.1


def _check(strategy, opt, w, b, ref, t, correction):
    rw, rb, rdw, rdb = ref[t]
    assert_copies_follow(w, b, rw, rb, t + 1)
    if correction != "none":
        dw, db = strategy.extended.correction_state(opt).delta_numpy()
        np.testing.assert_allclose(dw, np.stack(rdw), rtol=1e-4, atol=1e-4, err_msg=f"delta step {t + 1}")
        np.testing.assert_allclose(db, np.stack(rdb), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(dw.sum(axis=0), 0.0, atol=1e-4)  # Σ_i Δ_i = 0 with the stale snapshot too


def _run(w0, b0, batches, interval, correction, momentum, sync_after, check, **kw):
    """Overlapped custom-loop steps with ``strategy.sync()`` after the steps in ``sync_after``; ``check(
    strategy, opt, w, b, t)`` after each step. Returns the strategy."""
    strategy = SkipCorrectStrategy(
        interval=interval, correction=correction, devices=DEVICES, overlap=True, **kw
    )
    assert strategy.overlap
    with strategy.scope():
        w, b = tf.Variable(w0), tf.Variable(b0)
        opt = tf.keras.optimizers.SGD(LR, momentum=momentum)
    step = softmax_step(strategy, w, b, opt, R * B)
    for t, row in enumerate(batches):
        step(row)
        if t + 1 in sync_after:
            strategy.sync()  # applies the in-flight mean (with its Δ update), then averages
        check(strategy, opt, w, b, t)
    return strategy


@pytest.mark.parametrize(
    "correction,interval,momentum", [("none", 2, 0.0), ("vrl", 3, 0.0), ("gradient", 2, 0.9)]
)
def test_custom_loop_follows_the_numpy_overlap_rule_every_step(correction, interval, momentum):
    steps, sync_after = 11, (8,)
    w0, b0 = _init()
    batches = make_batches(steps, R, B, F, C, seed=interval + 31)
    ref = run_overlap_rule(
        w0,
        b0,
        batches,
        interval,
        correction,
        LR,
        sync_after=sync_after,
        make_opt=lambda: _NumpyOpt("sgd", LR, momentum=momentum),
    )
    check = lambda strategy, opt, w, b, t: _check(strategy, opt, w, b, ref, t, correction)  # noqa: E731
    strategy = _run(w0, b0, batches, interval, correction, momentum, sync_after, check)
    strategy.extended.drain()  # the last launched all-reduce has run (its bytes are counted when it runs)
    st = strategy.stats()
    launched = steps // interval
    assert st["steps"] == steps and st["syncs"] == launched + len(sync_after)
    n_bufs = 2 if correction == "gradient" else 1  # the G_i travel with the snapshot
    assert st["bytes_communicated"] == (launched * n_bufs + len(sync_after)) * (F * C + C) * 4
    assert st["background_comm_s"] > 0
    # the last step is local and a mean is in flight: the replicas differ
    assert max(np.abs(ref[-1][0][i] - ref[-1][0][0]).max() for i in range(R)) > 1e-3


def test_fit_follows_the_rule_and_drains_at_the_end():
    rng = np.random.RandomState(5)
    w0, b0 = rng.randn(F, C).astype(np.float32) * 0.3, np.zeros(C, np.float32)
    steps, h = 8, 3
    batches = make_batches(steps, R, B, F, C, seed=21)
    ref = run_overlap_rule(w0, b0, batches, h, "vrl", LR, drain_after=(steps,))
    strategy = SkipCorrectStrategy(interval=h, correction="vrl", devices=DEVICES, overlap=True)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(C, input_shape=(F,))])
        model.layers[0].set_weights([w0, b0])
        model.compile(
            tf.keras.optimizers.SGD(LR),
            tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=2,
        )
    x = np.concatenate([np.concatenate([r[0] for r in row]) for row in batches])
    y = np.concatenate([np.concatenate([r[1] for r in row]) for row in batches])
    model.fit(x, y, batch_size=R * B, epochs=1, shuffle=False, verbose=0)
    assert strategy.extended.drain() == 0  # fit applied the mean launched at step 6
    kernel = model.layers[0].kernel
    for i in range(R):
        np.testing.assert_allclose(kernel.values[i].numpy(), ref[-1][0][i], rtol=1e-5, atol=1e-5)
    dw, _ = strategy.extended.correction_state(model.optimizer).delta_numpy()
    np.testing.assert_allclose(dw, np.stack(ref[-1][2]), rtol=1e-4, atol=1e-4)
    assert np.abs(dw).max() > 1e-3
    # evaluate sees the global model: every replica equal afterwards
    model.evaluate(x[:40], y[:40], batch_size=R * B, verbose=0)
    wbar = sum(ref[-1][0]) / R
    for c in kernel.values:
        np.testing.assert_allclose(c.numpy(), wbar, rtol=1e-5, atol=1e-5)


def test_overlap_argument_is_checked():
    with pytest.raises(InputError, match=r"overlap=.*must be True or False, got 'yes'") as e:
        SkipCorrectStrategy(interval=2, devices=DEVICES, overlap="yes")
    assert "\n" not in str(e.value)


def test_auto_with_overlap_hides_the_communication():
    # H = clip(ceil(t_comm / t_comp), 1, max): the background all-reduces' median against the steps'
    from tf_commopt.core.interval import overlap_interval

    strategy = SkipCorrectStrategy(
        interval="auto", devices=DEVICES[:2], max_interval=64, auto_probe_interval=4, overlap=True
    )
    with strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.layers.Dense(256, activation="relu", input_shape=(64,)), tf.keras.layers.Dense(4)]
        )
        model.compile(tf.keras.optimizers.SGD(0.01), "mse")
    rng = np.random.RandomState(0)
    x, y = rng.rand(320, 64).astype(np.float32), rng.rand(320, 4).astype(np.float32)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)  # 20 steps
    st = strategy.stats()
    assert st["interval_chosen"] == 1 and st["steps"] == 20
    # the probe's 3 samples are background all-reduces (applied at steps 6, 10, 14), all > 0
    assert len(st["interval_t_comm_samples_s"]) == 3 and min(st["interval_t_comm_samples_s"]) > 0
    want = overlap_interval(st["interval_t_comm_s"], st["interval_t_comp_s"], max_interval=64)
    assert st["interval"] == strategy.interval == want
    assert strategy.extended.drain() == 0


@pytest.mark.parametrize("correction", ["none", "gradient"])
def test_averaged_momenta_follow_the_decayed_overlap_rule(correction):
    """average_optimizer_state=True: the applied mean adds μ^k (m̄_y − m_i,y) to each momentum (k local
    steps since the snapshot), the weights and Δ as without slots; strategy.sync() averages the momenta."""
    steps, interval, mu, sync_after = 11, 3, 0.9, (8,)
    w0, b0 = _init()
    batches = make_batches(steps, R, B, F, C, seed=41)
    sgd = lambda: _NumpyOpt("sgd", LR, momentum=mu)  # noqa: E731
    ref = run_overlap_rule(
        w0, b0, batches, interval, correction, LR, sgd, sync_after=sync_after, avg_slots=True
    )

    def check(strategy, opt, w, b, t):
        rw, rb, _, _, rmw, rmb = ref[t]
        assert_copies_follow(w, b, rw, rb, t + 1)
        for slot, want in zip(opt.momentums, (rmw, rmb)):  # built in the order [w, b]
            got = np.stack([c.numpy() for c in slot.values])
            np.testing.assert_allclose(got, np.stack(want), rtol=1e-4, atol=1e-5, err_msg=f"momentum {t + 1}")

    _run(w0, b0, batches, interval, correction, mu, sync_after, check, average_optimizer_state=True)
    assert np.abs(ref[5][4][0] - ref[5][4][1]).max() > 1e-3  # the momenta differ between syncs
