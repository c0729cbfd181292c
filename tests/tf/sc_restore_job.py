"""Subprocess half of the save/restore test: restore a SkipCorrectStrategy checkpoint and continue.

Run: python tests/tf/sc_restore_job.py CKPT OUT.npz [auto]
Writes the per-replica kernels, Δ and stats after continuing, then tries to restore into a 2-replica
strategy and records the error message. With ``auto``: the checkpoint is from an interval="auto" run
saved after 4 steps; this process builds an "auto" strategy whose own measurement would choose H = 1.
"""

import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np
import tensorflow as tf

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 4
)

from tests.tf.test_skip_correct_restore import SPLIT, B, R, build, data  # noqa: E402
from tf_commopt.errors import InputError  # noqa: E402


def main_auto(ckpt: str, out: str) -> None:
    x, y, batch = data()
    strategy, model = build(R, auto_ratio=1e9)
    model.load_weights(ckpt)
    split = 4 * R * B
    model.fit(x[split:], y[split:], batch_size=batch, epochs=1, shuffle=False, verbose=0)
    kernel = np.stack([c.numpy() for c in model.layers[0].kernel.values])
    delta = strategy.extended.correction_state(model.optimizer).delta_numpy()[0]
    st = strategy.stats()
    np.savez(
        out,
        kernel=kernel,
        delta=delta,
        iterations=int(model.optimizer.iterations.numpy()),
        interval=strategy.interval,
        **{
            k: st[k]
            for k in (
                "syncs",
                "interval_chosen",
                "interval_overhead_s",
                "interval_t_comm_s",
                "interval_t_comp_s",
            )
        },
    )


def main(ckpt: str, out: str) -> None:
    x, y, batch = data()
    strategy, model = build(4)
    model.load_weights(ckpt)
    model.fit(x[SPLIT:], y[SPLIT:], batch_size=batch, epochs=1, shuffle=False, verbose=0)
    kernel = np.stack([c.numpy() for c in model.layers[0].kernel.values])
    delta = strategy.extended.correction_state(model.optimizer).delta_numpy()[0]
    message = ""
    small, model2 = build(2)
    try:
        model2.load_weights(ckpt)
        model2.fit(x[SPLIT:], y[SPLIT:], batch_size=10, epochs=1, shuffle=False, verbose=0)
    except InputError as e:
        message = str(e)
    np.savez(
        out,
        kernel=kernel,
        delta=delta,
        iterations=int(model.optimizer.iterations.numpy()),
        syncs=strategy.stats()["syncs"],
        message=message,
    )


if __name__ == "__main__":
    (main_auto if sys.argv[3:] == ["auto"] else main)(sys.argv[1], sys.argv[2])
