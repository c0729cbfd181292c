"""The graph loop (``SkipCorrectStrategy(graph_loop=True)``, the default): ``model.fit`` runs the local steps
up to each sync as one traced call, with the exact rule, the H rhythm, callbacks and History kept."""

import numpy as np
import pytest
import tensorflow as tf

from tests.tf.sc_reference import make_batches, run_overlap_rule, run_rule
from tf_commopt.distribute import SkipCorrectStrategy
from tf_commopt.distribute.graph_loop import steps_to_next_sync

R, B, F, C, LR = 4, 5, 3, 4, 0.2
DEVICES = ["/cpu:%d" % i for i in range(R)]


class _Calls(tf.keras.callbacks.Callback):
    """Records every call's last step (``batch``, per epoch) and the loss tf-keras logs there."""

    def __init__(self):
        super().__init__()
        self.batches, self.losses = [], []

    def on_epoch_begin(self, epoch, logs=None):
        self.batches.append([])

    def on_train_batch_end(self, batch, logs=None):
        self.batches[-1].append(batch)
        self.losses.append(float(logs["loss"]))


def _fit(batches, h, graph_loop, epochs=1, overlap=False, callbacks=(), warmup_steps=0, **compile_kwargs):
    rng = np.random.RandomState(5)
    w0, b0 = rng.randn(F, C).astype(np.float32) * 0.3, np.zeros(C, np.float32)
    strategy = SkipCorrectStrategy(
        interval=h,
        correction="vrl",
        devices=DEVICES,
        overlap=overlap,
        graph_loop=graph_loop,
        warmup_steps=warmup_steps,
    )
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(C, input_shape=(F,))])
        model.layers[0].set_weights([w0, b0])
        model.compile(
            tf.keras.optimizers.SGD(LR),
            tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            **compile_kwargs,
        )
    x = np.concatenate([np.concatenate([r[0] for r in row]) for row in batches])
    y = np.concatenate([np.concatenate([r[1] for r in row]) for row in batches])
    calls = _Calls()
    steps = len(batches) // epochs
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(R * B).repeat()
    hist = model.fit(ds, epochs=epochs, steps_per_epoch=steps, verbose=0, callbacks=[calls, *callbacks])
    return (w0, b0), strategy, model, hist, calls


def test_steps_to_next_sync():
    assert steps_to_next_sync(0, 0, 16, 0) == 16
    assert steps_to_next_sync(16, 0, 16, 0) == 16
    assert steps_to_next_sync(21, 5, 16, 0) == 11
    assert steps_to_next_sync(0, 0, 4, 3) == 3  # the SSGD warm-up: a call ends where it ends
    assert steps_to_next_sync(2, 0, 4, 3) == 1
    assert steps_to_next_sync(3, 0, 4, 3) == 4
    assert steps_to_next_sync(9, 7, 4, 0) == 1  # H lowered below k: the next step syncs


@pytest.mark.parametrize("epochs", [1, 2])
def test_one_call_per_interval_keeps_the_exact_rule_rhythm_and_history(epochs):
    steps, h = 10, 3  # per epoch 10 / epochs steps: H does not divide the epoch
    batches = make_batches(steps, R, B, F, C, seed=23)
    (w0, b0), strategy, model, hist, calls = _fit(batches, h, True, epochs=epochs)
    ref = run_rule(w0, b0, batches, h, "vrl", LR)
    for i in range(R):  # step 10 is one step after the sync at 9
        np.testing.assert_allclose(
            model.layers[0].kernel.values[i].numpy(), ref[-1][0][i], rtol=1e-5, atol=1e-5
        )
    dw, _ = strategy.extended.correction_state(model.optimizer).delta_numpy()
    np.testing.assert_allclose(dw, np.stack(ref[-1][2]), rtol=1e-4, atol=1e-4)
    st = strategy.stats()
    assert st["steps"] == steps and st["syncs"] == steps // h
    # every call ends at a sync (steps 3, 6, 9) or at the epoch's end; batch = the call's last step
    assert calls.batches == ([[2, 5, 8, 9]] if epochs == 1 else [[2, 4], [0, 3, 4]])
    assert int(model.steps_per_execution.numpy()) == 1  # the user's value is back
    # one trace of the loop for every call length, one of tf-keras's step (its metrics built before)
    assert model.train_function.function.experimental_get_tracing_count() == 1
    assert model.train_tf_function.experimental_get_tracing_count() == 1

    # the same run one step per call: identical weights, History and per-call logs at the same steps
    _, _, model1, hist1, calls1 = _fit(batches, h, False, epochs=epochs)
    for a, b in zip(model.get_weights(), model1.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    for key in ("loss", "accuracy"):
        np.testing.assert_allclose(hist.history[key], hist1.history[key], rtol=1e-6)
    flat1 = [b for ep in calls1.batches for b in ep]
    assert flat1 == (list(range(10)) if epochs == 1 else list(range(5)) * 2)
    at = [i for i, b in enumerate(flat1) if b in {2, 5, 8, 9}] if epochs == 1 else [2, 4, 5, 8, 9]
    np.testing.assert_allclose(calls.losses, [calls1.losses[i] for i in at], rtol=1e-6)


def test_warmup_steps_and_overlap_keep_the_rule():
    steps, h = 9, 3
    batches = make_batches(steps, R, B, F, C, seed=7)
    (w0, b0), _, model, _, calls = _fit(batches, h, True, warmup_steps=2)
    ref = run_rule(w0, b0, batches, h, "vrl", LR, warmup_steps=2)
    for i in range(R):
        np.testing.assert_allclose(
            model.layers[0].kernel.values[i].numpy(), ref[-1][0][i], rtol=1e-5, atol=1e-5
        )
    assert calls.batches == [[1, 4, 7, 8]]  # the 2 SSGD steps in one call, then a sync every 3 local steps

    (w0, b0), strategy, model, _, calls = _fit(batches, h, True, overlap=True)
    ref = run_overlap_rule(w0, b0, batches, h, "vrl", LR, drain_after=(steps,))
    assert strategy.extended.drain() == 0  # fit applied the last in-flight mean
    for i in range(R):
        np.testing.assert_allclose(
            model.layers[0].kernel.values[i].numpy(), ref[-1][0][i], rtol=1e-5, atol=1e-5
        )
    assert calls.batches == [[2, 5, 8]]


class _EveryStep(tf.keras.callbacks.Callback):
    needs_every_step = True


def test_one_step_per_call_when_asked_or_when_the_user_chose_steps_per_execution():
    batches = make_batches(6, R, B, F, C, seed=3)
    *_, calls = _fit(batches, 3, True, callbacks=[_EveryStep()])
    assert calls.batches == [list(range(6))]
    _, _, model, _, calls = _fit(batches, 3, True, steps_per_execution=2)
    assert calls.batches == [[1, 3, 5]] and int(model.steps_per_execution.numpy()) == 2
    backup = tf.keras.callbacks.BackupAndRestore("/tmp/unused_graph_loop_backup", save_freq=2)  # counts calls
    from tf_commopt import _compat
    from tf_commopt.distribute.graph_loop import GraphLoop

    tk = _compat.tf_keras_internals()
    strategy = SkipCorrectStrategy(interval=3, devices=DEVICES)
    with strategy.scope():
        m = tf.keras.Sequential([tf.keras.layers.Dense(C, input_shape=(F,))])
        m.compile("sgd", "mse")
    assert GraphLoop(m, strategy, tk, []).active
    assert not GraphLoop(m, strategy, tk, [backup]).active
    assert not GraphLoop(m, SkipCorrectStrategy(interval=3, devices=DEVICES, graph_loop=False), tk, []).active


def test_graph_loop_argument_is_checked():
    from tf_commopt.errors import InputError

    with pytest.raises(InputError, match=r"graph_loop=.*must be True or False"):
        SkipCorrectStrategy(interval=2, devices=DEVICES, graph_loop="yes")


class _StopEvery(tf.keras.callbacks.Callback):
    """Needs a call to end at every N-th step (as the runner's evaluation curve does)."""

    def __init__(self, every):
        super().__init__()
        self.every, self.done = every, 0

    def on_train_batch_end(self, batch, logs=None):
        self.done = batch + 1

    def steps_to_next_stop(self):
        return self.every - self.done % self.every


def test_a_callback_can_end_calls_at_its_steps_and_the_rule_is_kept():
    steps, h = 10, 3
    batches = make_batches(steps, R, B, F, C, seed=29)
    (w0, b0), strategy, model, _, calls = _fit(batches, h, True, callbacks=[_StopEvery(5)])
    assert calls.batches == [[2, 4, 5, 8, 9]]  # syncs after steps 3, 6, 9; stops after 5 and 10
    ref = run_rule(w0, b0, batches, h, "vrl", LR)
    for i in range(R):
        np.testing.assert_allclose(
            model.layers[0].kernel.values[i].numpy(), ref[-1][0][i], rtol=1e-5, atol=1e-5
        )
    assert strategy.stats()["syncs"] == 3


def test_a_model_built_by_its_first_call_trains_with_the_exact_rule():
    """A Sequential without an input shape has no variables before fit: the loop lets the trace build them."""
    batches = make_batches(8, R, B, F, C, seed=9)
    strategy2 = SkipCorrectStrategy(interval=4, correction="vrl", devices=DEVICES)
    with strategy2.scope():
        unbuilt = tf.keras.Sequential([tf.keras.layers.Dense(C, kernel_initializer="zeros")])
        unbuilt.compile(
            tf.keras.optimizers.SGD(LR), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
    assert not unbuilt.built
    x = np.concatenate([np.concatenate([r[0] for r in row]) for row in batches])
    y = np.concatenate([np.concatenate([r[1] for r in row]) for row in batches])
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(R * B).repeat()
    unbuilt.fit(ds, epochs=1, steps_per_epoch=8, verbose=0)
    zeros = (np.zeros((F, C), np.float32), np.zeros(C, np.float32))
    ref = run_rule(*zeros, batches, 4, "vrl", LR)
    for i, c in enumerate(unbuilt.layers[0].kernel.values):
        np.testing.assert_allclose(c.numpy(), ref[-1][0][i], rtol=1e-5, atol=1e-5)
    assert strategy2.stats()["syncs"] == 2
