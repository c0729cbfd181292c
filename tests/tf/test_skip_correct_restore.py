"""Save mid-interval, restore in a new process, continue: equals the run that saved and continued
(a fixed H, and interval="auto" after H was chosen: the restored run keeps H and does not measure again)."""

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


def build(replicas, auto_ratio=None):
    """auto_ratio=None: interval=H. Otherwise interval="auto" with target_ratio=auto_ratio and a cap of H:
    1e-9 makes the first-iteration rule choose H whatever the timings, 1e9 makes it choose 1."""
    from tf_commopt.distribute import SkipCorrectStrategy

    devices = ["/cpu:%d" % i for i in range(replicas)]
    if auto_ratio is None:
        strategy = SkipCorrectStrategy(interval=H, correction="vrl", devices=devices)
    else:
        strategy = SkipCorrectStrategy(
            interval="auto",
            correction="vrl",
            devices=devices,
            target_ratio=auto_ratio,
            max_interval=H,
            auto_warmup_steps=1,
            auto_probe_interval=1,
            auto_measure_syncs=1,
        )
    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.layers.Dense(
                    C, input_shape=(F,), kernel_initializer=tf.keras.initializers.Constant(0.1)
                )
            ]
        )
        model.compile(
            tf.keras.optimizers.SGD(LR), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
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
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "tf", "sc_restore_job.py"), ckpt, out],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(out)
    assert int(got["iterations"]) == 10
    np.testing.assert_allclose(got["kernel"], kernel, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["delta"], delta, rtol=1e-5, atol=1e-5)
    assert "checkpoint was written with 4 replicas but this SkipCorrectStrategy has 2" in str(got["message"])


def test_auto_interval_restored_in_new_process_keeps_h_and_does_not_measure_again(tmp_path):
    # auto_warmup_steps=1: step 1 at H = 1, step 2 is measured (its sync), H = 3 from then on: syncs after
    # steps 5 and 8; the save after 4 steps is mid-interval (k = 2)
    x, y, batch = data()
    split = 4 * R * B
    strategy, model = build(R, auto_ratio=1e-9)
    model.fit(x[:split], y[:split], batch_size=batch, epochs=1, shuffle=False, verbose=0)
    saved = strategy.stats()
    assert saved["interval_chosen"] == 1 and strategy.interval == H
    assert int(strategy.extended.correction_state(model.optimizer).local_steps.numpy()) == 2
    ckpt = str(tmp_path / "ckpt")
    model.save_weights(ckpt)
    model.fit(x[split:], y[split:], batch_size=batch, epochs=1, shuffle=False, verbose=0)
    kernel = np.stack([c.numpy() for c in model.layers[0].kernel.values])
    delta = strategy.extended.correction_state(model.optimizer).delta_numpy()[0]
    assert np.abs(kernel[1] - kernel[0]).max() > 1e-4  # step 10 is local: the replicas differ

    # the new process asks for target_ratio=1e9: measuring again would choose H = 1 and change the weights
    out = str(tmp_path / "resumed_auto.npz")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "tf", "sc_restore_job.py"), ckpt, out, "auto"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(out)
    assert int(got["iterations"]) == 10
    assert int(got["interval"]) == H == saved["interval"]
    assert int(got["interval_chosen"]) == 1 and float(got["interval_overhead_s"]) == 0.0  # no new measurement
    assert float(got["interval_t_comm_s"]) == saved["interval_t_comm_s"]
    assert float(got["interval_t_comp_s"]) == saved["interval_t_comp_s"]
    assert int(got["syncs"]) == 2  # this process: the scheduled syncs after steps 5 and 8
    np.testing.assert_allclose(got["kernel"], kernel, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["delta"], delta, rtol=1e-5, atol=1e-5)


def test_runner_backup_resume_keeps_the_auto_interval(tmp_path):
    """experiments.train --backup_dir with --interval=auto: the resumed run keeps the H of the first run
    (its own --target_ratio would choose 1) and ends with the uninterrupted run's weights."""
    import io

    from experiments import train

    kw = dict(
        strategy="skip_correct",
        replicas=2,
        model="mlp",
        batch_size=100,
        momentum=0.0,
        learning_rate=0.1,
        interval="auto",
        max_interval=H,
        auto_probe_interval=4,
        seed=1,
    )
    # 40 steps per epoch; H is chosen after 2 + 3 x 4 = 14 steps; the epoch-1 backup is mid-interval (k = 1)
    whole = train.run(
        train.Config(epochs=2, target_ratio=1e-9, backup_dir=str(tmp_path / "a"), **kw), out=io.StringIO()
    )
    part = train.run(
        train.Config(epochs=1, target_ratio=1e-9, backup_dir=str(tmp_path / "b"), **kw), out=io.StringIO()
    )
    resumed = train.run(
        train.Config(epochs=2, target_ratio=1e9, backup_dir=str(tmp_path / "b"), **kw), out=io.StringIO()
    )
    assert whole.record["interval"] == part.record["interval"] == H
    assert (
        resumed.record["resumed_after_epoch"] == 1 and resumed.record["steps"] == whole.record["steps"] == 80
    )
    assert resumed.record["interval"] == H and resumed.record["interval_overhead_s"] == 0.0
    assert resumed.record["interval_t_comm_s"] == part.record["interval_t_comm_s"]
    for a, b in zip(whole.model.get_weights(), resumed.model.get_weights()):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
