"""SkipCorrectStrategy(period="time") against an independent numpy reference of the unequal-count rule,
step by step, with fixed step-time tables (so the counts are known); equal speeds == period="steps"."""

import numpy as np
import pytest
import tensorflow as tf

from tests.tf.sc_reference import _NumpyOpt, assert_copies_follow, make_batches, run_time_rule, softmax_step
from tf_commopt.core import unequal
from tf_commopt.core.period import TimeBudget
from tf_commopt.distribute import SkipCorrectStrategy
from tf_commopt.errors import InputError

B, F, C, LR = 5, 3, 4, 0.2


def _init():
    rng = np.random.RandomState(7)
    return rng.randn(F, C).astype(np.float32) * 0.3, rng.randn(C).astype(np.float32) * 0.1


def _run(strategy, batches, w0, b0, make_opt, r, on_step=None):
    with strategy.scope():
        w, b = tf.Variable(w0), tf.Variable(b0)
        opt = make_opt()
    step = softmax_step(strategy, w, b, opt, r * B)
    for t, row in enumerate(batches):
        step(row)
        if on_step is not None:
            on_step(t, w, b, opt)
    return w, b, opt


CASES = [
    # (replicas, H, step times, counts TimePeriod gives)
    (2, 4, (0.01, 0.02), (4, 2)),
    (4, 4, (0.01, 0.02, 0.03, 0.015), (4, 2, 1, 2)),
    (4, 5, (0.03, 0.01, 0.01, 0.02), (1, 5, 5, 2)),
]


@pytest.mark.parametrize(
    "correction,optimizer,tau_eff",
    [
        ("vrl", "sgd", "mean"),
        ("gradient", "momentum", "mean"),
        ("none", "sgd", "mean"),
        ("vrl", "sgd", "max"),
    ],
)
@pytest.mark.parametrize("r,h,times,counts", CASES)
def test_unequal_counts_match_numpy_every_step(r, h, times, counts, correction, optimizer, tau_eff):
    assert TimeBudget(step_times=times).counts(h) == counts
    w0, b0 = _init()
    steps = 3 * h + 2  # three syncs and a period under way
    batches = make_batches(steps, r, B, F, C, seed=r + h)
    if optimizer == "sgd":
        make_tf, make_np = (lambda: tf.keras.optimizers.SGD(LR)), (lambda: _NumpyOpt("sgd", LR))
    else:
        make_tf = lambda: tf.keras.optimizers.SGD(LR, momentum=0.5)  # noqa: E731
        make_np = lambda: _NumpyOpt("sgd", LR, momentum=0.5)  # noqa: E731
    ref, syncs = run_time_rule(w0, b0, batches, h, counts, correction, make_np, LR, tau_eff=tau_eff)
    strategy = SkipCorrectStrategy(
        interval=h,
        correction=correction,
        period=TimeBudget(step_times=times, tau_eff=tau_eff),
        devices=["/cpu:%d" % i for i in range(r)],
    )

    def check(t, w, b, opt):
        rw, rb, rdw = ref[t]
        assert_copies_follow(w, b, rw, rb, t + 1)
        if correction != "none":
            dw = strategy.extended.correction_state(opt).delta_numpy()[0]
            np.testing.assert_allclose(dw, np.stack(rdw), rtol=1e-4, atol=1e-4, err_msg=f"delta {t + 1}")
            np.testing.assert_allclose(dw.sum(axis=0), 0.0, atol=1e-4)

    _run(strategy, batches, w0, b0, make_tf, r, check)
    st = strategy.stats()
    assert st["period_steps"] == list(counts) and st["syncs"] == 3 and st["tau_eff"] == tau_eff
    assert st["real_steps"] == [3 * c + max(0, 2 - (h - c)) for c in counts]
    # the reference's syncs are core/unequal.py's rule too (a second, independent statement of it)
    for _, xs, x0, new in syncs:
        np.testing.assert_allclose(
            unequal.normalised_average(x0, xs, list(counts), tau_eff=tau_eff), new, rtol=1e-12
        )
    # not a trivial case: the normalised average differs from the plain mean
    p, xs, x0, new = syncs[0]
    assert np.abs(new - sum(xs) / r).max() > 1e-4


@pytest.mark.parametrize("correction,momentum", [("vrl", 0.0), ("gradient", 0.9)])
def test_equal_speeds_are_the_step_rule_bit_for_bit(correction, momentum):
    r, h = 4, 3
    w0, b0 = _init()
    batches = make_batches(2 * h + 1, r, B, F, C, seed=3)
    out = []
    for period in (
        "steps",
        TimeBudget(step_times=(0.02,) * r),
        TimeBudget(step_times=(0.02, 0.02, 0.021, 0.02)),  # 5% slower: within the default tolerance
        TimeBudget(step_times=(0.02, 0.02, 0.021, 0.02), tolerance=0.0),
        TimeBudget(step_times=(0.02,) * r, tau_eff="max"),
    ):
        strategy = SkipCorrectStrategy(
            interval=h, correction=correction, period=period, devices=["/cpu:%d" % i for i in range(r)]
        )
        w, b, opt = _run(strategy, batches, w0, b0, lambda: tf.keras.optimizers.SGD(LR, momentum=momentum), r)
        out.append(([c.numpy() for c in w.values], strategy.extended.correction_state(opt).delta_numpy()[0]))
    for same in (1, 2, 4):
        for i in range(r):
            np.testing.assert_array_equal(out[0][0][i], out[same][0][i])
        np.testing.assert_array_equal(out[0][1], out[same][1])
    # without the tolerance the 5% slower replica takes floor(3 · 0.02/0.021) = 2 steps: the run differs
    assert TimeBudget(step_times=(0.02, 0.02, 0.021, 0.02), tolerance=0.0).counts(h) == (3, 3, 2, 3)
    assert np.abs(out[0][0][0] - out[3][0][0]).max() > 0


def test_bad_period_arguments_are_one_line_errors():
    with pytest.raises(InputError, match=r"period=\.\.\.\): must be 'steps', 'time' or a TimeBudget"):
        SkipCorrectStrategy(interval=4, period="wall")
    with pytest.raises(InputError, match="fixed integer interval"):
        SkipCorrectStrategy(interval="auto", period="time")
    with pytest.raises(InputError, match="does not overlap"):
        SkipCorrectStrategy(interval=4, period="time", overlap=True)
    with pytest.raises(InputError, match="3 step times for 2 replicas"):
        SkipCorrectStrategy(
            interval=4, period=TimeBudget(step_times=(1.0, 1.0, 1.0)), devices=["/cpu:0", "/cpu:1"]
        )
    with pytest.raises(InputError, match=r"step_times=\.\.\.\)\[1\]: must be a finite number"):
        TimeBudget(step_times=(1.0, -1.0))
    with pytest.raises(InputError, match=r"tau_eff=\.\.\.\): must be one of mean, max, got 'median'"):
        TimeBudget(tau_eff="median")


def test_checkpoint_mid_period_restores_x0_counts_and_corrections(tmp_path):
    r, h, times, counts = 4, 4, (0.01, 0.02, 0.03, 0.015), (4, 2, 1, 2)
    w0, b0 = _init()
    batches = make_batches(3 * h + 2, r, B, F, C, seed=5)
    split = h + 2  # k = 2 of 4: the replicas differ from x₀
    ref, _ = run_time_rule(
        w0, b0, batches, h, counts, "vrl", lambda: _NumpyOpt("sgd", LR), LR, mean_after=(split,)
    )
    devices = ["/cpu:%d" % i for i in range(r)]
    first = SkipCorrectStrategy(
        interval=h, correction="vrl", period=TimeBudget(step_times=times), devices=devices
    )
    w, b, opt = _run(first, batches[:split], w0, b0, lambda: tf.keras.optimizers.SGD(LR), r)
    first.sync()  # as model.save_weights does: every replica holds the mean (x₀, Δ_i, k are kept)
    path = tf.train.Checkpoint(w=w, b=b, opt=opt).save(str(tmp_path / "ckpt"))
    x0_saved = first.extended.time_period.x0[id(first.extended.correction_state(opt))][0].values[0].numpy()
    assert np.abs(x0_saved - w.values[0].numpy()).max() > 1e-4  # mid-period: x₀ is not the model
    np.testing.assert_allclose(x0_saved, ref[h - 1][0][0], rtol=1e-5, atol=1e-5)  # the model at the sync

    second = SkipCorrectStrategy(
        interval=h, correction="vrl", period=TimeBudget(step_times=times), devices=devices
    )
    with second.scope():
        w2, b2 = tf.Variable(np.zeros_like(w0)), tf.Variable(np.zeros_like(b0))
        opt2 = tf.keras.optimizers.SGD(LR)
    tf.train.Checkpoint(w=w2, b=b2, opt=opt2).restore(path)
    step = softmax_step(second, w2, b2, opt2, r * B)
    for t in range(split, len(batches)):
        step(batches[t])
        for i in range(r):
            np.testing.assert_allclose(
                w2.values[i].numpy(), ref[t][0][i], rtol=1e-5, atol=1e-5, err_msg=f"{t + 1}"
            )
    np.testing.assert_allclose(
        second.extended.correction_state(opt2).delta_numpy()[0], np.stack(ref[-1][2]), rtol=1e-4, atol=1e-4
    )


def test_fit_history_callbacks_and_measured_counts():
    """model.fit on 2 replicas: fixed counts (4, 2) with an epoch end inside a period (History,
    callbacks and counters right), then measured times (equal replicas in one process: every count H)."""
    r, h = 2, 4
    x = np.random.RandomState(0).randn(96, F).astype(np.float32)
    y = (np.arange(96) % C).astype(np.int32)
    for period, counts in ((TimeBudget(step_times=(0.01, 0.02)), [4, 2]), ("time", [4, 4])):
        strategy = SkipCorrectStrategy(interval=h, period=period, devices=["/cpu:%d" % i for i in range(r)])
        with strategy.scope():
            model = tf.keras.Sequential([tf.keras.layers.Dense(C, input_shape=(F,))])
            model.compile(
                tf.keras.optimizers.SGD(0.1),
                tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"],
            )
        ends = []

        class Count(tf.keras.callbacks.Callback):
            def __init__(self, out):
                super().__init__()
                self.out = out

            def on_train_batch_end(self, batch, logs=None):
                self.out.append((batch, float(logs["loss"])))

        ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8)
        hist = model.fit(ds, epochs=2, steps_per_epoch=6, callbacks=[Count(ends)], verbose=0)
        st = strategy.stats()
        assert len(hist.history["loss"]) == 2 and all(np.isfinite(hist.history["loss"]))
        assert st["steps"] == 12 and st["syncs"] == 3 and st["period_steps"] == counts
        # calls end at syncs and at the epoch end: batches 3, 5 | 1, 5 (tf-keras: a call's last step)
        assert [b for b, _ in ends] == [3, 5, 1, 5] and all(loss > 0 for _, loss in ends)
        if period == "time":
            assert st["real_steps"] == [12, 12] and all(t > 0 for t in st["period_step_times_s"])
        else:
            assert st["real_steps"] == [12, 6]
