"""Graceful preemption in one process (4 local replicas): a SIGTERM during ``fit`` makes
``save_on_preemption`` save at the first agreement point after it (under SkipCorrectStrategy: a step
right after a sync, at most one check per ``every`` steps; under SSGD: any step), then stop."""

import os
import signal

import numpy as np
import pytest
import tensorflow as tf

from tf_commopt.distribute import SkipCorrectStrategy
from tf_commopt.distribute.preemption import PREEMPTED_EXIT_CODE, PreemptionWatch, save_on_preemption
from tf_commopt.errors import InputError

DEVICES = ["/cpu:%d" % i for i in range(4)]


def _fit(strategy, signal_before_step, steps=40, exit_code=None, every=8):
    rng = np.random.RandomState(0)
    x, y = rng.randn(steps * 16, 3).astype("float32"), rng.randint(0, 2, steps * 16)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,))])
        model.compile(
            tf.keras.optimizers.SGD(0.1), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
    saved = []

    class Kill(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch + 1 == signal_before_step:
                os.kill(os.getpid(), signal.SIGTERM)

        def steps_to_next_stop(self):  # the graph loop starts a call at the signal's step
            t = int(model.optimizer.iterations.numpy())
            return signal_before_step - 1 - t if signal_before_step - 1 > t else steps

    cb = save_on_preemption(lambda m, step: saved.append(step), every=every, exit_code=exit_code)
    before = signal.getsignal(signal.SIGTERM)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[Kill(), cb])
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is put back
    return saved, int(model.optimizer.iterations.numpy())


def test_skip_correct_saves_at_the_step_after_the_next_allowed_sync_and_stops():
    # H = 4: syncs after steps 4, 8, 12, ...; checks at 4 (no signal yet), then not before 4 + 8 = 12
    saved, done = _fit(SkipCorrectStrategy(interval=4, devices=DEVICES), signal_before_step=6)
    assert saved == [12] and done == 12
    saved, done = _fit(SkipCorrectStrategy(interval=4, devices=DEVICES), signal_before_step=14, every=1)
    assert saved == [16] and done == 16  # every=1: the first sync after the signal


def test_ssgd_saves_at_the_next_allowed_step():
    saved, done = _fit(tf.distribute.MirroredStrategy(DEVICES), signal_before_step=6, every=1)
    assert saved == [6] and done == 6


def test_no_signal_no_save_and_exit_code_after_the_save():
    saved, done = _fit(SkipCorrectStrategy(interval=4, devices=DEVICES), signal_before_step=-1)
    assert saved == [] and done == 40
    with pytest.raises(SystemExit) as e:
        _fit(
            SkipCorrectStrategy(interval=4, devices=DEVICES),
            signal_before_step=2,
            exit_code=PREEMPTED_EXIT_CODE,
        )
    assert e.value.code == 143


def test_bad_every_and_notify():
    with pytest.raises(InputError, match=r"^PreemptionWatch\(every=...\): must be an integer >= 1"):
        PreemptionWatch(tf.distribute.get_strategy(), every=0)
    w = PreemptionWatch(tf.distribute.get_strategy(), every=1)
    assert not w.should_stop(1)
    w.notify()  # a platform's own notice, without a signal
    assert w.received and w.should_stop(2) and w.stopped_at == 2 and w.should_stop(3)
