"""One worker of the 2-worker interval="auto" cluster test (started by tf_commopt.cluster.run_cluster).

Usage: python tests/cluster/_auto_worker.py
Trains a ~1 MB dense model with model.fit under SkipCorrectStrategy(interval="auto") on this worker's
own random data and prints strategy.stats() as one JSON line.
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

from tf_commopt.distribute import SkipCorrectStrategy  # noqa: E402


def main() -> None:
    strategy = SkipCorrectStrategy(interval="auto", max_interval=1000)
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    with strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.layers.Dense(512, activation="relu", input_shape=(480,)), tf.keras.layers.Dense(10)]
        )
        model.compile(tf.keras.optimizers.SGD(0.01), "mse")
    rng = np.random.RandomState(task)
    x, y = rng.rand(64, 480).astype(np.float32), rng.rand(64, 10).astype(np.float32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat()
    model.fit(ds, epochs=1, steps_per_epoch=52, verbose=0)
    print(json.dumps(dict(strategy.stats(), task=task)), flush=True)


if __name__ == "__main__":
    main()
