"""The Keras conventions users rely on, under SkipCorrectStrategy: a Keras 3 model is
refused (not trained silently without skipping), mixed_float16 with loss scaling follows the rule,
BackupAndRestore resumes exactly, TensorBoard works (or says what to install)."""

import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.tf.sc_reference import make_batches, run_rule
from tf_commopt.distribute import SkipCorrectStrategy

R, B, F, C, LR = 4, 5, 3, 4, 0.2
DEVICES = ["/cpu:%d" % i for i in range(R)]


def _global_batches(batches):
    x = np.concatenate([np.concatenate([r[0] for r in row]) for row in batches])
    y = np.concatenate([np.concatenate([r[1] for r in row]) for row in batches])
    return x, y


# ---- Keras 3 ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "mode,case", [("late", "sequential"), ("late", "functional"), ("early", "sequential")]
)
def test_keras3_under_the_strategy_is_a_one_line_error_saying_what_to_do(keras3_jobs, mode, case):
    line = keras3_jobs[mode][case]  # tests/tf/_keras3_job.py in a fresh interpreter
    assert line.startswith("ERROR InputError SkipCorrectStrategy:"), line
    # late: the variable creator's check (Keras 3 model under a tf-keras process); otherwise the
    # constructor's (Keras 3 is the active tf.keras): both say what to do
    assert "TF_USE_LEGACY_KERAS=1" in line and (
        "import tf_keras" in line if mode == "late" else "tf-keras" in line
    )


def test_keras3_check_does_not_fire_for_tf_keras_or_plain_variables():
    import keras  # Keras 3 imported beside tf-keras: the frame check is active

    assert int(keras.__version__.split(".")[0]) >= 3
    from tf_commopt.distribute import _keras_hooks

    _keras_hooks.refuse_keras3()  # plain code
    strategy = SkipCorrectStrategy(interval=2, devices=DEVICES[:2])
    with strategy.scope():
        v = tf.Variable(1.0)
        model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,))])
        model.compile(tf.keras.optimizers.Adam(0.1), "mse")
    model.fit(np.ones((8, 3), np.float32), np.ones((8, 2), np.float32), batch_size=4, verbose=0)
    assert float(v.numpy()) == 1.0 and strategy.stats()["steps"] == 2


# ---- mixed_float16 ----------------------------------------------------------------------------------
@pytest.fixture
def mixed_policy():
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    tf.keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("legacy", [False, True])
def test_mixed_float16_fit_with_loss_scaling_follows_the_rule(mixed_policy, legacy):
    rng = np.random.RandomState(5)
    w0, b0 = rng.randn(F, C).astype(np.float32) * 0.3, np.zeros(C, np.float32)
    steps, h = 7, 3
    batches = make_batches(steps, R, B, F, C, seed=21)
    ref = run_rule(w0, b0, batches, h, "vrl", LR)
    strategy = SkipCorrectStrategy(interval=h, correction="vrl", devices=DEVICES)
    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.layers.Dense(C, input_shape=(F,)),
                tf.keras.layers.Activation("linear", dtype="float32"),
            ]
        )
        model.layers[0].set_weights([w0, b0])
        sgd = tf.keras.optimizers.legacy.SGD(LR) if legacy else tf.keras.optimizers.SGD(LR)
        model.compile(sgd, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert isinstance(model.optimizer, tf.keras.mixed_precision.LossScaleOptimizer)
    assert model.optimizer.dynamic and model.layers[0].compute_dtype == "float16"
    x, y = _global_batches(batches)
    model.fit(x, y, batch_size=R * B, epochs=1, shuffle=False, verbose=0)
    st = strategy.stats()
    assert st["steps"] == steps and st["syncs"] == 2 and st["bytes_communicated"] == 2 * (F * C + C) * 4
    assert int(model.optimizer.iterations.numpy()) == steps
    kernel = model.layers[0].kernel
    rw = ref[-1][0]
    assert np.abs(rw[1] - rw[0]).max() > 1e-2  # step 7 is local: the replicas differ by more than fp16 noise
    for i in range(R):  # float16 forward/backward: the rule to fp16 accuracy
        np.testing.assert_allclose(kernel.values[i].numpy(), rw[i], rtol=0, atol=5e-3, err_msg=f"replica {i}")
    dw = strategy.extended.correction_state(model.optimizer.inner_optimizer).delta_numpy()[0]
    np.testing.assert_allclose(dw, np.stack(ref[-1][2]), rtol=0, atol=2e-2)


def test_mixed_float16_a_non_finite_gradient_on_one_replica_skips_the_step_everywhere(mixed_policy):
    strategy = SkipCorrectStrategy(interval=2, correction="vrl", devices=DEVICES)
    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.layers.Dense(C, input_shape=(F,), kernel_initializer="ones"),
                tf.keras.layers.Activation("linear", dtype="float32"),
            ]
        )
        model.compile(
            tf.keras.optimizers.SGD(LR), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
    scale0 = float(model.optimizer.loss_scale.numpy())
    x = np.ones((R * B, F), np.float32)
    x[B : 2 * B] = 7e4  # replica 1's activations overflow float16: its gradient is not finite
    y = np.zeros(R * B, np.int64)
    model.fit(x, y, batch_size=R * B, epochs=1, shuffle=False, verbose=0)
    for i in range(R):  # no replica applied anything, and all halved the loss scale together
        np.testing.assert_array_equal(model.layers[0].kernel.values[i].numpy(), np.ones((F, C), np.float32))
    assert float(model.optimizer.loss_scale.numpy()) == scale0 / 2
    assert int(model.optimizer.iterations.numpy()) == 1
    assert (
        strategy.extended.correction_state(model.optimizer.inner_optimizer) is None
        or int(strategy.extended.correction_state(model.optimizer.inner_optimizer).local_steps.numpy()) == 0
    )


# ---- BackupAndRestore (one process; the 2-worker resume: tests/cluster/test_backup_and_restore_cluster.py) --
class _Preempted(Exception):
    pass


class _StopAt(tf.keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise _Preempted()


def _backup_run(backup_dir, init, epochs, stop_at=None, optimizer="sgd"):
    strategy = SkipCorrectStrategy(interval=3, devices=DEVICES, average_optimizer_state=(optimizer == "adam"))
    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.layers.Dense(
                    C, input_shape=(F,), kernel_initializer=tf.keras.initializers.Constant(init)
                )
            ]
        )
        opt = tf.keras.optimizers.Adam(0.05) if optimizer == "adam" else tf.keras.optimizers.SGD(LR)
        model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = _global_batches(
        make_batches(5, R, B, F, C, seed=43)
    )  # 5 steps per epoch, H = 3: backups mid-interval
    callbacks = [tf.keras.callbacks.BackupAndRestore(str(backup_dir))] + (
        [_StopAt(stop_at)] if stop_at else []
    )
    try:
        hist = model.fit(x, y, batch_size=R * B, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)
        ran = len(hist.history["loss"])
    except _Preempted:
        ran = None
    state = strategy.extended.correction_state(model.optimizer)
    kernels = np.stack([c.numpy() for c in model.layers[0].kernel.values])
    return (
        ran,
        kernels,
        state.delta_numpy()[0],
        int(model.optimizer.iterations.numpy()),
        int(state.local_steps.numpy()),
    )


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_backup_and_restore_resumes_exactly(tmp_path, optimizer):
    _, k_whole, d_whole, t_whole, k_steps = _backup_run(tmp_path / "a", 0.1, 4, optimizer=optimizer)
    ran, _, d_cut, t_cut, k_cut = _backup_run(tmp_path / "b", 0.1, 4, stop_at=2, optimizer=optimizer)
    assert ran is None and t_cut == 10 and k_cut == 1 and np.abs(d_cut).max() > 1e-3  # backed up mid-interval
    ran, k_res, d_res, t_res, k_steps_res = _backup_run(
        tmp_path / "b", 0.0, 4, optimizer=optimizer
    )  # new model
    assert ran == 2 and t_res == t_whole == 20 and k_steps_res == k_steps
    np.testing.assert_allclose(k_res, k_whole, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(d_res, d_whole, rtol=1e-5, atol=1e-5)


# ---- TensorBoard ------------------------------------------------------------------------------------
def _tensorboard_installed():
    try:
        import tensorboard.summary  # noqa: F401
    except ImportError:
        return False
    return True


def test_tensorboard_callback_writes_scalars_or_fails_at_once_saying_what_to_install(tmp_path):
    """Whichever way this machine is set up: with tensorboard the callback writes the epoch scalars;
    without it (TensorFlow 2.21 does not install it) fit fails before the first step with one line."""
    strategy = SkipCorrectStrategy(interval=2, devices=DEVICES)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(C, input_shape=(F,))])
        model.compile(
            tf.keras.optimizers.SGD(LR), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
    x, y = _global_batches(make_batches(4, R, B, F, C, seed=3))

    def fit():
        tensorboard = tf.keras.callbacks.TensorBoard(str(tmp_path / "tb"))
        return model.fit(x, y, batch_size=R * B, epochs=2, verbose=0, callbacks=[tensorboard])

    if _tensorboard_installed():
        fit()
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(tmp_path / "tb" / "train"), size_guidance={"tensors": 0})
        acc.Reload()
        assert [e.step for e in acc.Tensors("epoch_loss")] == [0, 1]
        assert strategy.stats()["syncs"] == 4
    else:
        from tf_commopt.errors import InputError

        with pytest.raises(InputError) as info:
            fit()
        assert str(info.value).count("\n") == 0 and "pip install tensorboard" in str(info.value)
        assert strategy.stats()["steps"] == 0  # refused at train begin, not after an epoch


def test_without_tensorboard_the_callback_is_a_one_line_error_before_training(monkeypatch, tmp_path):
    from tf_commopt.errors import InputError

    for name in [m for m in sys.modules if m == "tensorboard" or m.startswith("tensorboard.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed (put back after)
    s = SkipCorrectStrategy(interval=2, devices=DEVICES[:2])
    with s.scope():
        m = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,))])
        m.compile("sgd", "mse")
    with pytest.raises(InputError) as e:
        m.fit(
            np.ones((8, 3)),
            np.ones((8, 2)),
            batch_size=4,
            epochs=2,
            verbose=0,
            callbacks=[tf.keras.callbacks.TensorBoard(str(tmp_path / "tb"))],
        )
    msg = str(e.value)
    assert msg.startswith("TensorBoard: tf.keras.callbacks.TensorBoard needs the tensorboard"), msg
    assert "pip install tensorboard" in msg and "\n" not in msg and s.stats()["steps"] == 0
