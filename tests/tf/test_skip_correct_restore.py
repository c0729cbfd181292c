"""Save mid-interval, restore in a new process, continue: equals the run that saved and continued."""
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

from tests.tf.sc_reference import make_batches

R, B, F, C, LR, H = 4, 5, 3, 4, 0.2, 3
SPLIT = 5 * R * B  # save after 5 steps: k = 2 of H = 3 (mid-interval)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def data():
    batches = make_batches(10, R, B, F, C, seed=31)
    x = np.concatenate([np.concatenate([r[0] for r in row]) for row in batches])
    y = np.concatenate([np.concatenate([r[1] for r in row]) for row in batches])
    return x, y, R * B


def build(replicas):
    from tf_commopt.distribute import SkipCorrectStrategy
    strategy = SkipCorrectStrategy(interval=H, correction="vrl", devices=["/cpu:%d" % i for i in range(replicas)])
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(C, input_shape=(F,),
                                                           kernel_initializer=tf.keras.initializers.Constant(0.1))])
        model.compile(tf.keras.optimizers.SGD(LR), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return strategy, model


def test_restore_in_new_process_continues_exactly(tmp_path):
    x, y, batch = data()
    strategy, model = build(R)
    model.fit(x[:SPLIT], y[:SPLIT], batch_size=batch, epochs=1, shuffle=False, verbose=0)
    before = np.stack([c.numpy() for c in model.layers[0].kernel.values])
    assert np.abs(before[1] - before[0]).max() > 1e-4  # mid-interval: the replicas differ
    ckpt = str(tmp_path / "ckpt")
    model.save_weights(ckpt)  # averages first (out of rhythm), then writes x̄, t, k and every Δ_i
    model.fit(x[SPLIT:], y[SPLIT:], batch_size=batch, epochs=1, shuffle=False, verbose=0)
    kernel = np.stack([c.numpy() for c in model.layers[0].kernel.values])
    delta = strategy.extended.correction_state(model.optimizer).delta_numpy()[0]
    assert np.abs(delta).max() > 1e-3

    out = str(tmp_path / "resumed.npz")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "tf", "sc_restore_job.py"), ckpt, out],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(out)
    assert int(got["iterations"]) == 10
    np.testing.assert_allclose(got["kernel"], kernel, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["delta"], delta, rtol=1e-5, atol=1e-5)
    assert "checkpoint was written with 4 replicas but this SkipCorrectStrategy has 2" in str(got["message"])
