"""One worker of the 2-worker SkipCorrectStrategy cluster test (started by tf_commopt.cluster.run_cluster).

Usage: python tests/cluster/_sc_worker.py OUT_DIR
Trains softmax regression with a custom loop (H = 3, vrl) on this worker's own data, records its copy
of the variables and its Δ after every step, then runs model.fit for a few steps and evaluates.
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

from tests.tf.sc_reference import make_batches, softmax_step  # noqa: E402
from tf_commopt.distribute import SkipCorrectStrategy  # noqa: E402

R, B, F, C, LR, H, STEPS = 2, 5, 3, 4, 0.2, 3, 7


def main(out_dir: str) -> None:
    strategy = SkipCorrectStrategy(interval=H, correction="vrl")
    assert strategy.num_replicas_in_sync == R, strategy.num_replicas_in_sync
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    rng = np.random.RandomState(7)
    w0, b0 = rng.randn(F, C).astype(np.float32) * 0.3, rng.randn(C).astype(np.float32) * 0.1
    batches = make_batches(STEPS, R, B, F, C, seed=17)
    with strategy.scope():
        w = tf.Variable(w0)
        b = tf.Variable(b0)
        opt = tf.keras.optimizers.SGD(LR)

    step = softmax_step(strategy, w, b, opt, R * B)

    ws, bs, ds = [], [], []
    for row in batches:
        step(row)
        ws.append(w.values[0].numpy())
        bs.append(b.values[0].numpy())
        ds.append(strategy.extended.correction_state(opt).delta_numpy()[0][0])
    stats = strategy.stats()
    # every worker writes (the chief's copy is the real one): Δ of both workers is gathered into it
    tf.train.Checkpoint(optimizer=opt).write(os.path.join(out_dir, f"ckpt{task}", "ckpt"))

    # model.fit / evaluate under the multi-worker machinery
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(C, input_shape=(F,))])
        model.compile(
            tf.keras.optimizers.SGD(LR), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
    x = np.concatenate([r[0] for row in batches for r in row])
    y = np.concatenate([r[1] for row in batches for r in row])
    ds_fit = tf.data.Dataset.from_tensor_slices((x, y)).batch(R * B).repeat()
    model.fit(ds_fit, epochs=1, steps_per_epoch=4, verbose=0)
    loss = model.evaluate(tf.data.Dataset.from_tensor_slices((x, y)).batch(R * B), verbose=0)
    kernel_after_eval = model.layers[0].kernel.values[0].numpy()
    np.savez(
        os.path.join(out_dir, f"worker{task}.npz"),
        w=np.stack(ws),
        b=np.stack(bs),
        d=np.stack(ds),
        syncs=stats["syncs"],
        bytes=stats["bytes_communicated"],
        loss=loss,
        kernel_after_eval=kernel_after_eval,
    )
    print("done", task, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
