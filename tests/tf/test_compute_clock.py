"""The compute clock (telemetry ``compute_s``, the samples of ``interval="auto"`` and ``period="time"``)
covers each step's own work: its start is ordered after the step's local update, not only after the
optimizer's iteration count (whose increment TensorFlow may run before the update)."""

import numpy as np
import tensorflow as tf

from experiments.slow import slow_train_step
from tf_commopt.distribute import SkipCorrectStrategy
from tf_commopt.tf.slowdown import sleep_log


def test_compute_seconds_hold_every_emulated_slow_step():
    strategy = SkipCorrectStrategy(interval=4, devices=["/cpu:0"])
    with strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.layers.Dense(8, activation="relu", input_shape=(6,)), tf.keras.layers.Dense(3)]
        )
        model.compile(
            tf.keras.optimizers.SGD(0.1), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
    slow_train_step(model, 40.0)  # each forward and backward sleeps 39 x its own time after it
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(96, 6)).astype("float32"), rng.integers(0, 3, size=96)
    sleep_log(clear=True)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    slept = [s for _, _, s in sleep_log(clear=True)]
    stats = strategy.stats()
    assert stats["steps"] == 12 and len(slept) == 12
    # the first step after a clock reset adds nothing; every later step's sleep happened inside its clock
    assert stats["compute_s"] >= 0.95 * sum(slept[1:]) > 0
