"""SkipCorrectStrategy under tf-keras: fit/evaluate/predict/save, SSGD and single-device equivalences."""

import os

import numpy as np
import pytest
import tensorflow as tf

from tests.tf.sc_reference import fresh_mirrored, make_batches, run_rule
from tf_commopt.distribute import SkipCorrectStrategy
from tf_commopt.keras import SkipCorrectTelemetry

R, B, F, C, LR = 4, 5, 3, 4, 0.2
DEVICES = ["/cpu:%d" % i for i in range(R)]


def _softmax_model(w0, b0, opt, **compile_kwargs):
    model = tf.keras.Sequential([tf.keras.layers.Dense(C, input_shape=(F,))])
    model.layers[0].set_weights([w0, b0])
    model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), **compile_kwargs)
    return model


def _global_batches(batches):
    """Keras splits each global batch into R consecutive per-replica slices."""
    x = np.concatenate([np.concatenate([r[0] for r in row]) for row in batches])
    y = np.concatenate([np.concatenate([r[1] for r in row]) for row in batches])
    return x, y


def test_fit_follows_the_rule_then_evaluate_predict_see_the_global_model(tmp_path):
    rng = np.random.RandomState(5)
    w0, b0 = rng.randn(F, C).astype(np.float32) * 0.3, np.zeros(C, np.float32)
    steps, h = 7, 3
    batches = make_batches(steps, R, B, F, C, seed=21)
    ref = run_rule(w0, b0, batches, h, "vrl", LR)
    strategy = SkipCorrectStrategy(interval=h, correction="vrl", devices=DEVICES)
    with strategy.scope():
        model = _softmax_model(w0, b0, tf.keras.optimizers.SGD(LR))
    x, y = _global_batches(batches)
    hist = model.fit(
        x,
        y,
        batch_size=R * B,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[SkipCorrectTelemetry(log_dir=str(tmp_path / "tb"))],
    )
    kernel = model.layers[0].kernel
    rw = ref[-1][0]
    for i in range(R):  # step 7 is one step after the sync at 6: replicas differ
        np.testing.assert_allclose(kernel.values[i].numpy(), rw[i], rtol=1e-5, atol=1e-5)
    assert np.abs(rw[1] - rw[0]).max() > 1e-3
    dw, _ = strategy.extended.correction_state(model.optimizer).delta_numpy()
    np.testing.assert_allclose(dw, np.stack(ref[-1][2]), rtol=1e-4, atol=1e-4)
    logs = hist.history
    assert logs["sc_interval"] == [3.0] and logs["sc_syncs"] == [2.0] and logs["sc_steps"] == [7.0]
    assert logs["sc_bytes_per_sync"] == [float((F * C + C) * 4)]
    assert logs["sc_comm_s_per_sync"][0] > 0 and logs["sc_compute_s_per_step"][0] > 0
    assert any(f.startswith("events") for f in os.listdir(tmp_path / "tb"))

    # evaluate averages first (out of rhythm): loss of the global model, replicas equal afterwards
    wbar = sum(rw) / R
    bbar = sum(ref[-1][1]) / R
    xe, ye = x[:40], y[:40]
    loss = model.evaluate(xe, ye, batch_size=R * B, verbose=0)
    z = xe @ wbar + bbar
    z = z - z.max(1, keepdims=True)
    ref_loss = float(np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(len(ye)), ye]))
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    for c in kernel.values:
        np.testing.assert_allclose(c.numpy(), wbar, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        model.predict(xe, batch_size=R * B, verbose=0), xe @ wbar + bbar, rtol=1e-4, atol=1e-5
    )

    # the saved model is the global model and loads without any strategy
    model.save(str(tmp_path / "m.keras"))
    plain = tf.keras.models.load_model(str(tmp_path / "m.keras"))
    np.testing.assert_allclose(plain.layers[0].kernel.numpy(), wbar, rtol=1e-5, atol=1e-5)


def _mlp(seed, bn=False):
    tf.keras.utils.set_random_seed(seed)
    layers = [tf.keras.layers.Dense(8, activation="tanh", input_shape=(F,))]
    if bn:
        layers.append(tf.keras.layers.BatchNormalization())
    layers.append(tf.keras.layers.Dense(C))
    return tf.keras.Sequential(layers)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_interval_one_none_equals_mirrored_ssgd_in_fit(momentum):
    batches = make_batches(6, R, B, F, C, seed=2)
    x, y = _global_batches(batches)
    weights = {}
    for name in ("sc", "mirrored"):
        if name == "sc":
            strategy = SkipCorrectStrategy(
                interval=1, correction="none", average_optimizer_state=True, devices=DEVICES
            )
        else:
            strategy = fresh_mirrored(DEVICES)
        with strategy.scope():
            model = _mlp(3)
            model.compile(
                tf.keras.optimizers.SGD(LR, momentum=momentum),
                tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        model.fit(x, y, batch_size=R * B, epochs=1, shuffle=False, verbose=0)
        weights[name] = model.get_weights()
    for a, b in zip(weights["sc"], weights["mirrored"]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_identical_data_on_every_replica_equals_single_device_adam():
    rng = np.random.RandomState(4)
    data = [(rng.randn(B, F).astype(np.float32), rng.randint(0, C, B).astype(np.int32)) for _ in range(7)]
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE
    )
    single = _mlp(9)
    opt1 = tf.keras.optimizers.Adam(0.05)
    for xb, yb in data:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(yb, single(xb)))
        opt1.apply_gradients(zip(tape.gradient(loss, single.trainable_variables), single.trainable_variables))

    strategy = SkipCorrectStrategy(interval=3, correction="vrl", devices=DEVICES)
    with strategy.scope():
        model = _mlp(9)
        opt = tf.keras.optimizers.Adam(0.05)

    @tf.function
    def step(xb, yb):
        def fn():
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_fn(yb, model(xb)), global_batch_size=R * B)
            opt.apply_gradients(
                zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
            )

        strategy.run(fn)

    for xb, yb in data:
        step(tf.constant(xb), tf.constant(yb))
    for v, ref in zip(model.trainable_variables, single.trainable_variables):
        for c in v.values:
            np.testing.assert_allclose(c.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)
    assert strategy.stats()["syncs"] == 2


def test_batchnorm_statistics_and_slots_are_averaged_at_sync():
    batches = make_batches(4, R, B, F, C, seed=8)
    x, y = _global_batches(batches)
    strategy = SkipCorrectStrategy(
        interval=2, correction="none", average_optimizer_state=True, devices=DEVICES
    )
    with strategy.scope():
        model = _mlp(1, bn=True)
        model.compile(
            tf.keras.optimizers.SGD(LR, momentum=0.9),
            tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    model.fit(x[: 3 * R * B], y[: 3 * R * B], batch_size=R * B, epochs=1, shuffle=False, verbose=0)
    bn = model.layers[1]
    comps = np.stack([c.numpy() for c in bn.moving_mean.values])
    assert np.abs(comps[1] - comps[0]).max() > 1e-6  # step 3 is local: the statistics differ again
    model.fit(x[3 * R * B :], y[3 * R * B :], batch_size=R * B, epochs=1, shuffle=False, verbose=0)
    comps = np.stack([c.numpy() for c in bn.moving_mean.values])  # step 4 synced
    np.testing.assert_allclose(comps, np.broadcast_to(comps.mean(0), comps.shape), atol=1e-6)
    slots = [v for v in model.optimizer.variables() if v.dtype.is_floating and v.shape.rank]
    assert slots
    for s in slots:
        cs = np.stack([c.numpy() for c in s.values])
        np.testing.assert_allclose(cs, np.broadcast_to(cs[0], cs.shape), atol=1e-6)


class _RecordingPolicy:
    """An interval policy with the FirstIterationPolicy interface that records what it was given."""

    def __init__(self, answer):
        self.answer, self.calls = answer, []

    def choose(self, t_comm_s, t_comp_s):
        self.calls.append((t_comm_s, t_comp_s))
        return self.answer


def test_auto_interval_policy_hook_sets_h_from_measured_times():
    batches = make_batches(12, R, B, F, C, seed=6)
    x, y = _global_batches(batches)
    strategy = SkipCorrectStrategy(interval="auto", correction="vrl", devices=DEVICES)
    with strategy.scope():
        model = _softmax_model(
            np.zeros((F, C), np.float32), np.zeros(C, np.float32), tf.keras.optimizers.SGD(LR)
        )
    policy = _RecordingPolicy(3)
    model.fit(
        x,
        y,
        batch_size=R * B,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[SkipCorrectTelemetry(interval_policy=policy, policy_after_steps=3)],
    )
    assert len(policy.calls) == 1 and policy.calls[0][0] > 0 and policy.calls[0][1] > 0
    # H = 1 for steps 1-2 (2 warm-up syncs); step 3 starts the built-in probe (H = 4, k = 1); the policy
    # then sets H = 3, which ends the built-in selection: syncs after steps 5, 8 and 11
    assert strategy.interval == 3 and strategy.stats()["syncs"] == 5


@pytest.mark.parametrize("spe", [2, 4])
def test_steps_per_execution_keeps_the_exact_rule_and_rhythm(spe):
    # several local steps per call: syncs still land on every H-th step (H = 3 does not divide spe = 2 or 4)
    rng = np.random.RandomState(8)
    w0, b0 = rng.randn(F, C).astype(np.float32) * 0.3, np.zeros(C, np.float32)
    steps, h = 10, 3
    batches = make_batches(steps, R, B, F, C, seed=23)
    ref = run_rule(w0, b0, batches, h, "vrl", LR)
    strategy = SkipCorrectStrategy(interval=h, correction="vrl", devices=DEVICES)
    with strategy.scope():
        model = _softmax_model(w0, b0, tf.keras.optimizers.SGD(LR), steps_per_execution=spe)
    x, y = _global_batches(batches)
    model.fit(x, y, batch_size=R * B, epochs=1, shuffle=False, verbose=0)
    for i in range(R):  # step 10 is one step after the sync at 9
        np.testing.assert_allclose(
            model.layers[0].kernel.values[i].numpy(), ref[-1][0][i], rtol=1e-5, atol=1e-5
        )
    st = strategy.stats()
    assert st["steps"] == steps and st["syncs"] == steps // h
