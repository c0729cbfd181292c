"""One worker of the 2-worker tf.keras.callbacks.BackupAndRestore test (started by tf_commopt.cluster.run_cluster).

Usage: python tests/cluster/_sc_backup_worker.py OUT_DIR BACKUP_DIR whole|interrupt|resume [OPTIMIZER]
``whole``: EPOCHS epochs of model.fit with BackupAndRestore. ``interrupt``: the same, every worker stops at
the start of epoch INTERRUPT_AT (a preempted job). ``resume``: a new cluster, a new model initialised to
zeros, the same fit call: BackupAndRestore restores the chief's backup and continues. Each worker records
its own copy of the kernel, its Δ, t and k after fit.
"""

import json
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.tf.sc_reference import make_batches  # noqa: E402
from tf_commopt.distribute import SkipCorrectStrategy  # noqa: E402

R, B, F, C, LR, H, EPOCHS, INTERRUPT_AT, STEPS_PER_EPOCH = 2, 5, 3, 4, 0.2, 3, 4, 2, 5


class Preempted(Exception):
    pass


class Interrupt(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == INTERRUPT_AT:
            raise Preempted(f"preempted at the start of epoch {epoch}")


def main(out_dir: str, backup_dir: str, mode: str, optimizer: str = "sgd") -> None:
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    strategy = SkipCorrectStrategy(interval=H, average_optimizer_state=(optimizer == "adam"))
    assert strategy.num_replicas_in_sync == R, strategy.num_replicas_in_sync
    # worker i reads its own (skewed) rows: sharding OFF, and the dataset's batch is the global batch, so
    # each step reads about B/R rows of this worker's stream; 5 steps per epoch (not a multiple of H)
    batches = make_batches(STEPS_PER_EPOCH, R, B, F, C, seed=41)
    x = np.concatenate([row[task][0] for row in batches])
    y = np.concatenate([row[task][1] for row in batches])
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(B)
    opts = tf.data.Options()
    opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    data = data.with_options(opts)
    init = 0.0 if mode == "resume" else 0.1
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
    callbacks = [tf.keras.callbacks.BackupAndRestore(backup_dir)]
    if mode == "interrupt":
        callbacks.append(Interrupt())
    try:
        hist = model.fit(data, epochs=EPOCHS, verbose=0, callbacks=callbacks)
        epochs_run = len(hist.history["loss"])
    except Preempted as e:
        print("interrupted:", e, flush=True)
        epochs_run = INTERRUPT_AT
    state = strategy.extended.correction_state(model.optimizer)
    np.savez(
        os.path.join(out_dir, f"{mode}{task}.npz"),
        kernel=model.layers[0].kernel.values[0].numpy(),
        bias=model.layers[0].bias.values[0].numpy(),
        delta=state.delta_numpy()[0][0] if state.deltas is not None else np.zeros(0),
        iterations=int(model.optimizer.iterations.numpy()),
        local_steps=int(state.local_steps.numpy()),
        epochs_run=epochs_run,
        syncs=strategy.stats()["syncs"],
        rule=state.rule,
    )
    print("done", mode, task, flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
