"""One worker of the 2-worker mixed_float16 test (started by tf_commopt.cluster.run_cluster).

Usage: python tests/cluster/_sc_mixed_worker.py OUT_DIR [POLICY]   (default mixed_float16; float32 as a control)
model.fit of softmax regression under mixed_float16 (dynamic loss scaling), H = 3, vrl, this worker's own
shard; records this worker's kernel, bias and Δ after STEPS steps, its syncs and the loss scale.
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

R, B, F, C, LR, H, STEPS = 2, 5, 3, 4, 0.2, 3, 7


def main(out_dir: str, policy: str = "mixed_float16") -> None:
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    tf.keras.mixed_precision.set_global_policy(policy)
    strategy = SkipCorrectStrategy(interval=H, correction="vrl")
    rng = np.random.RandomState(7)
    w0, b0 = rng.randn(F, C).astype(np.float32) * 0.3, rng.randn(C).astype(np.float32) * 0.1
    batches = make_batches(STEPS, R, B, F, C, seed=17)
    # this worker's own rows; with sharding OFF each worker's dataset is batched with the GLOBAL batch size
    # and read B rows per step: step t reads batches[t][task]
    x = np.concatenate([row[task][0] for row in batches])
    y = np.concatenate([row[task][1] for row in batches])
    opts = tf.data.Options()
    opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(R * B).repeat().with_options(opts)
    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.layers.Dense(C, input_shape=(F,)),
                tf.keras.layers.Activation("linear", dtype="float32"),
            ]
        )
        model.layers[0].set_weights([w0, b0])
        model.compile(
            tf.keras.optimizers.SGD(LR), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
    mixed = policy == "mixed_float16"
    assert not mixed or (
        isinstance(model.optimizer, tf.keras.mixed_precision.LossScaleOptimizer) and model.optimizer.dynamic
    )
    model.fit(data, epochs=1, steps_per_epoch=STEPS, verbose=0)
    state = strategy.extended.correction_state(model.optimizer.inner_optimizer if mixed else model.optimizer)
    st = strategy.stats()
    np.savez(
        os.path.join(out_dir, f"mixed{task}.npz"),
        w=model.layers[0].kernel.values[0].numpy(),
        b=model.layers[0].bias.values[0].numpy(),
        d=state.delta_numpy()[0][0],
        syncs=st["syncs"],
        steps=st["steps"],
        bytes=st["bytes_communicated"],
        iterations=int(model.optimizer.iterations.numpy()),
        compute_dtype=model.layers[0].compute_dtype,
    )
    print("done", task, flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
