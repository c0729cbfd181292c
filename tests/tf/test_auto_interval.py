"""AutoInterval / interval="auto" (the first-iteration rule, built into SkipCorrectStrategy) and the two
baseline policies (AdaComm-style callback, grid search), on logical CPUs."""

import numpy as np
import pytest
import tensorflow as tf

from tests.tf.sc_reference import make_batches, softmax_grads, softmax_step
from tf_commopt.core.interval import AdaCommPolicy, FirstIterationPolicy
from tf_commopt.distribute import AutoInterval, SkipCorrectStrategy
from tf_commopt.distribute.auto_interval import AdaCommCallback, keras_grid_search
from tf_commopt.errors import InputError

R, B, F, C, LR = 2, 5, 3, 4, 0.2
DEVICES = ["/cpu:0", "/cpu:1"]


def _rule_with_schedule(w0, b0, batches, intervals, lr, restart_after=None):
    """Plain numpy skip-and-correct (vrl, plain SGD); intervals[t] = H in force at step t+1;
    ``restart_after``: the step after whose sync Δ is zeroed (where "auto" chose H)."""
    r = len(batches[0])
    ws = [w0.astype(np.float64) for _ in range(r)]
    bs = [b0.astype(np.float64) for _ in range(r)]
    dws = [np.zeros_like(ws[0]) for _ in range(r)]
    dbs = [np.zeros_like(bs[0]) for _ in range(r)]
    k, hist = 0, []
    for t, step in enumerate(batches):
        for i in range(r):
            gw, gb = softmax_grads(ws[i], bs[i], *step[i])
            ws[i] = ws[i] - lr * (gw - dws[i])
            bs[i] = bs[i] - lr * (gb - dbs[i])
        k += 1
        if k >= intervals[t]:
            wbar, bbar = sum(ws) / r, sum(bs) / r
            for i in range(r):
                dws[i] = dws[i] + (wbar - ws[i]) / (k * lr)
                dbs[i] = dbs[i] + (bbar - bs[i]) / (k * lr)
            ws, bs, k = [wbar.copy() for _ in range(r)], [bbar.copy() for _ in range(r)], 0
        if t + 1 == restart_after:
            dws, dbs = [np.zeros_like(d) for d in dws], [np.zeros_like(d) for d in dbs]
        hist.append(([w.copy() for w in ws], [b.copy() for b in bs], [d.copy() for d in dws]))
    return hist


def _custom_loop(strategy, batches, w0, b0, on_step):
    with strategy.scope():
        w, b = tf.Variable(w0), tf.Variable(b0)
        opt = tf.keras.optimizers.SGD(LR)

    step = softmax_step(strategy, w, b, opt, R * B)

    for t, row in enumerate(batches):
        step(row)
        on_step(t, w, b, opt)


def test_auto_in_a_custom_loop_is_numpy_exact_after_choosing():
    # target_ratio tiny: H = max_interval whatever the timings, so the schedule is known in advance
    policy = AutoInterval(
        target_ratio=1e-9, max_interval=4, warmup_steps=2, probe_interval=2, measure_syncs=2
    )
    strategy = SkipCorrectStrategy(interval=policy, devices=DEVICES)
    assert strategy.interval_policy is policy and strategy.auto_interval
    rng = np.random.RandomState(7)
    w0, b0 = rng.randn(F, C).astype(np.float32) * 0.3, rng.randn(C).astype(np.float32) * 0.1
    batches = make_batches(14, R, B, F, C, seed=5)
    # steps 1-2 at H = 1 (warm-up), 3-6 at the probe H = 2 (timed syncs after steps 4 and 6, H chosen at
    # step 6, where Δ starts over), then H = 4: syncs after steps 10 and 14
    ref = _rule_with_schedule(w0, b0, batches, [1, 1] + [2] * 4 + [4] * 8, LR, restart_after=6)
    seen = []

    def check(t, w, b, opt):
        seen.append(strategy.interval)
        for i in range(R):
            np.testing.assert_allclose(
                w.values[i].numpy(), ref[t][0][i], rtol=1e-5, atol=1e-5, err_msg=f"step {t + 1}"
            )
            np.testing.assert_allclose(b.values[i].numpy(), ref[t][1][i], rtol=1e-5, atol=1e-5)
        dw, _ = strategy.extended.correction_state(opt).delta_numpy()
        np.testing.assert_allclose(
            dw, np.stack(ref[t][2]), rtol=1e-4, atol=1e-4, err_msg=f"delta step {t + 1}"
        )

    _custom_loop(strategy, batches, w0, b0, check)
    assert seen == [1] * 5 + [4] * 9
    st = strategy.stats()
    assert st["interval_chosen"] == 1 and st["syncs"] == 6
    assert st["interval_t_comm_s"] > 0 and st["interval_t_comp_s"] > 0
    # the agreed numbers are the medians of the samples (one process: the mean over replicas of equal values)
    assert len(st["interval_t_comm_samples_s"]) == 2 and len(st["interval_t_comp_samples_s"]) == 4
    assert st["interval_t_comm_s"] == pytest.approx(
        np.median(st["interval_t_comm_samples_s"]), rel=1e-5, abs=2e-6
    )
    assert st["interval_t_comp_s"] == pytest.approx(
        np.median(st["interval_t_comp_samples_s"]), rel=1e-5, abs=2e-6
    )
    assert 0 < st["interval_overhead_s"] < 5 and st["interval_selection_comm_s"] >= st["interval_t_comm_s"]


def test_auto_in_model_fit_picks_what_the_pure_policy_gives():
    strategy = SkipCorrectStrategy(interval="auto", devices=DEVICES, max_interval=64, auto_probe_interval=4)
    with strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.layers.Dense(256, activation="relu", input_shape=(64,)), tf.keras.layers.Dense(4)]
        )
        model.compile(tf.keras.optimizers.SGD(0.01, momentum=0.9), "mse")
    rng = np.random.RandomState(0)
    x, y = rng.rand(320, 64).astype(np.float32), rng.rand(320, 4).astype(np.float32)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)  # 20 steps
    st = strategy.stats()
    assert st["interval_chosen"] == 1 and st["steps"] == 20
    want = FirstIterationPolicy(max_interval=64).choose(st["interval_t_comm_s"], st["interval_t_comp_s"])
    assert st["interval"] == strategy.interval == want
    # 2 warm-up syncs at H = 1, 3 probe syncs at H = 4 (steps 6, 10, 14), then one every H steps
    assert st["syncs"] == 2 + 3 + 6 // want


def test_auto_arguments_are_checked():
    for kw, where in (
        ({"target_ratio": 0}, "target_ratio"),
        ({"max_interval": 0}, "max_interval"),
        ({"auto_warmup_steps": 0}, "auto_warmup_steps"),
        ({"auto_probe_interval": 0}, "auto_probe_interval"),
        ({"auto_measure_syncs": 0}, "auto_measure_syncs"),
    ):
        with pytest.raises(InputError, match=where):
            SkipCorrectStrategy(interval="auto", devices=DEVICES, **kw)


def test_the_shorthand_keywords_build_an_auto_interval():
    s = SkipCorrectStrategy(interval="auto", devices=DEVICES, max_interval=8, auto_probe_interval=4)
    assert s.interval_policy == AutoInterval(max_interval=8, probe_interval=4)
    assert SkipCorrectStrategy(interval="auto", devices=DEVICES).interval_policy == AutoInterval()
    fixed = SkipCorrectStrategy(interval=3, devices=DEVICES)
    assert fixed.interval_policy == 3 and not fixed.auto_interval
    with pytest.raises(InputError, match=r"^SkipCorrectStrategy\(interval=...\): give max_interval inside"):
        SkipCorrectStrategy(interval=AutoInterval(), devices=DEVICES, max_interval=8)


def _fit_setup(interval):
    strategy = SkipCorrectStrategy(interval=interval, devices=DEVICES)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(C, input_shape=(F,))])
        model.compile(
            tf.keras.optimizers.SGD(0.1), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
    rows = make_batches(40, 1, 2 * B, F, C, seed=3)
    x = np.concatenate([r[0][0] for r in rows])
    y = np.concatenate([r[0][1] for r in rows])
    return strategy, model, x, y


def test_adacomm_callback_follows_its_policy():
    strategy, model, x, y = _fit_setup(4)
    cb = AdaCommCallback(strategy, initial_interval=4, max_interval=8)
    losses = []

    class Rec(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            losses.append((batch, float(logs["loss"]), strategy.stats()["syncs"]))

    model.fit(x, y, batch_size=2 * B, epochs=1, verbose=0, callbacks=[cb, Rec()])
    p = cb.policy
    assert len(p.history) >= 2 and p.overhead_s > 0
    assert strategy.interval == p.interval == p.history[-1]
    # replay: the same losses at the same syncs give the same intervals (the all-reduced mean of
    # identical numbers on the replicas is the number itself); every call ends at a sync (the graph loop)
    replay, h, last, syncs = AdaCommPolicy(initial_interval=4, max_interval=8), 4, -1, 0
    for batch, loss, n in losses:
        assert batch - last == h or batch == 39, (batch, last, h)  # 40 steps: the last call ends the epoch
        if n > syncs:
            syncs, h = n, replay.on_sync(loss, 0.1)
        last = batch
    assert replay.history == p.history


def test_grid_search_tries_every_candidate_and_sets_the_best():
    strategy, model, x, y = _fit_setup(1)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(2 * B).repeat()
    h, policy = keras_grid_search(model, strategy, ds, steps_per_trial=4, candidates=(1, 2, 4))
    assert sorted(policy.trials) == [1, 2, 4] and h in (1, 2, 4) and strategy.interval == h
    assert h == max((1, 2, 4), key=lambda c: (policy.trials[c].rate, -c))
    assert policy.overhead_s == pytest.approx(sum(t.wall_s for t in policy.trials.values()))
