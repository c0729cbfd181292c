"""One worker host of the 2-host GroupedHybridTrainer cluster test (started by tf_commopt.cluster.run_cluster).

Usage: python tests/cluster/_hybrid_worker.py OUT_DIR
Each host is one group of 2 logical CPUs running a 2-stage pipeline (host 0: capacities 1, 0.5; host 1:
1, 1, so host 1 gets the larger share of the global batch of 10). Host 1 builds its model from another seed: the strategy
must broadcast host 0's weights. Both hosts feed the same global batches; after two steps each host's
weights must equal single-device training on the global batches (computed here, from host 0's initial
weights). Writes OUT_DIR/worker<i>.npz.
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

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2
)
import tf_keras as keras  # noqa: E402

from tf_commopt.core.plan import PartitionPlan  # noqa: E402
from tf_commopt.distribute.hybrid import GroupedHybridTrainer  # noqa: E402


def build(seed):
    keras.utils.set_random_seed(seed)
    x = keras.Input((6,), name="x")
    a = keras.layers.Dense(8, activation="tanh", name="a")(x)
    b = keras.layers.Dense(8, activation="tanh", name="b")(a)
    r = keras.layers.Add(name="res")([a, keras.layers.Dense(8, name="c")(b)])
    return keras.Model(x, keras.layers.Dense(3, name="out")(r))


def main(out_dir):
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    caps = [1.0, 0.5] if task == 0 else [1.0, 1.0]
    plan = PartitionPlan(
        "hand",
        {"a": 0, "b": 0, "c": 1, "res": 1, "out": 1},
        [1, 0] if task == 0 else [0, 1],
        [0, 0],
        [0, 0],
        [0, 0],
        0.0,
        0.0,
    )
    strategy = GroupedHybridTrainer(capacities=caps, microbatches=2, plans=[plan], bandwidth_gbps=1e9)
    assert strategy.num_groups == 2 and strategy.devices == ["/CPU:0", "/CPU:1"], strategy.devices
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with strategy.scope():
        model = build(seed=100 + task)
        strategy.compile(model, optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss=loss)
    from tf_commopt.core.schedule.hybrid import split_batch

    sizes = strategy.group_batch_sizes(10)  # 1 / t_g of each host's pipeline, exchanged between the hosts
    assert sizes == split_batch(10, strategy.group_weights) and sizes[0] < sizes[1], (
        sizes,
        strategy.group_weights,
    )
    w0 = [w.numpy() for w in strategy.pipelines[0].model.trainable_weights]
    rng = np.random.default_rng(5)
    batches = [
        (rng.normal(size=(10, 6)).astype("float32"), rng.integers(0, 3, 10).astype("int32")) for _ in range(2)
    ]
    losses = [strategy.train_step(x, y) for x, y in batches]
    strategy.sync_model()

    ref = build(seed=100)  # host 0's initial weights, single device, the global batches
    opt = keras.optimizers.SGD(0.1, momentum=0.9)
    ref_losses = []
    for x, y in batches:
        with tf.GradientTape() as tape:
            lv = loss(y, ref(x, training=True))
        opt.apply_gradients(zip(tape.gradient(lv, ref.trainable_variables), ref.trainable_variables))
        ref_losses.append(float(lv))
    np.savez(
        os.path.join(out_dir, f"worker{task}.npz"),
        losses=np.array(losses),
        ref_losses=np.array(ref_losses),
        w0=np.concatenate([w.ravel() for w in w0]),
        ref_w0=np.concatenate([w.numpy().ravel() for w in build(seed=100).trainable_weights]),
        w=np.concatenate([w.numpy().ravel() for w in model.trainable_weights]),
        ref_w=np.concatenate([w.numpy().ravel() for w in ref.trainable_weights]),
    )
    print("done", task, losses, ref_losses)


if __name__ == "__main__":
    main(sys.argv[1])
