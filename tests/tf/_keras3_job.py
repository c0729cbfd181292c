"""A fresh interpreter where ``tf.keras`` is Keras 3 (started by tests/tf/conftest.py, ``keras3_jobs``).

Usage: python tests/tf/_keras3_job.py early|late
``early``: TF_USE_LEGACY_KERAS unset at TensorFlow's import (Keras 3 is the active tf.keras): a bare
SkipCorrectStrategy, then a Sequential model under one. ``late``: tf-keras loaded first and the variable set
too late for ``import keras`` (Keras 3): a Sequential and a functional model under the strategy.
Prints one line per case: ``<case> ERROR <type> <message>`` or ``<case> TRAINED <steps> <syncs>``.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ.pop("TF_USE_LEGACY_KERAS", None)
import numpy as np
import tensorflow as tf

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2
)
LATE = sys.argv[1] == "late"
if LATE:
    import tf_keras  # noqa: F401  (the constructor's check passes: tf-keras is loaded too)

    os.environ["TF_USE_LEGACY_KERAS"] = "1"  # set too late for `import keras` below: it is Keras 3
import keras  # noqa: E402

from tf_commopt.distribute import SkipCorrectStrategy  # noqa: E402

assert int(keras.__version__.split(".")[0]) >= 3, keras.__version__


def sequential():
    return keras.Sequential([keras.layers.Input((3,)), keras.layers.Dense(2)])


def functional():
    i = keras.Input((3,))
    return keras.Model(i, keras.layers.Dense(2)(i))


def train(build):
    strategy = SkipCorrectStrategy(interval=2, devices=["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = build()
        model.compile(keras.optimizers.SGD(0.1), "mse")
    model.fit(np.ones((8, 3), np.float32), np.ones((8, 2), np.float32), batch_size=4, verbose=0)
    return f"TRAINED {strategy.stats()['steps']} {strategy.stats()['syncs']}"


cases = {"sequential": lambda: train(sequential), "functional": lambda: train(functional)}
if not LATE:
    cases = {"constructor": lambda: SkipCorrectStrategy(devices=["/cpu:0"]) and "BUILT", **cases}
    del cases["functional"]
for name, case in cases.items():
    try:
        print(name, case(), flush=True)
    except Exception as e:
        print(name, "ERROR", type(e).__name__, " ".join(str(e).split()), flush=True)
