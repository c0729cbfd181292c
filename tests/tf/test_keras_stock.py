"""Wrap, don't patch: SkipCorrectStrategy reaches only the tf-keras optimizers and models built under its
scope; after creating and training with one, a model built outside any SkipCorrect scope is stock tf-keras
(the same class methods, bit-identical training to a process that never imported tf_commopt)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_TRAIN_OUTSIDE = """
def train_outside(legacy):
    tf.keras.utils.set_random_seed(3)
    model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="tanh", input_shape=(3,)),
                                 tf.keras.layers.Dense(2)])
    opts = tf.keras.optimizers.legacy if legacy else tf.keras.optimizers
    opt = opts.SGD(0.1, momentum=0.9)
    model.compile(opt, "mse")
    rng = np.random.RandomState(0)
    x, y = rng.randn(64, 3).astype("float32"), rng.randn(64, 2).astype("float32")
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    model.evaluate(x, y, verbose=0); model.predict(x, verbose=0)
    assert not {"apply_gradients", "aggregate_gradients", "_aggregate_gradients"} & set(vars(opt)), vars(opt).keys()
    assert not {"fit", "evaluate", "predict", "save", "save_weights"} & set(vars(model))
    return [w.tolist() for w in model.get_weights()]
"""

_PREAMBLE = (
    "import os; os.environ['TF_USE_LEGACY_KERAS'] = '1'\n"
    "import json, numpy as np, tensorflow as tf, tf_keras\n"
    "from tf_keras.src.optimizers import optimizer as o; from tf_keras.src.optimizers.legacy import optimizer_v2 as o2\n"
    "from tf_keras.src.engine import training as t; from tf_keras.src import callbacks as cb\n"
    "from tf_keras.src.mixed_precision import loss_scale_optimizer as lso\n"
    "def methods():\n"
    "    return [o.Optimizer.apply_gradients, o.Optimizer.aggregate_gradients, o2.OptimizerV2.apply_gradients,\n"
    "            o2.OptimizerV2._aggregate_gradients, tf_keras.optimizers.SGD.apply_gradients,\n"
    "            t.Model.fit, t.Model.evaluate, t.Model.predict, t.Model.save, t.Model.save_weights,\n"
    "            lso.LossScaleOptimizerV3.apply_gradients, lso.LossScaleOptimizer.apply_gradients,\n"
    "            cb.BackupAndRestore.on_train_begin, cb.TensorBoard.on_train_begin]\n"
    "stock = methods()\n" + _TRAIN_OUTSIDE
)

_WITH_SC = (
    _PREAMBLE
    + """
from tf_commopt.distribute import SkipCorrectStrategy
s = SkipCorrectStrategy(interval=2, devices=["/cpu:0"])
with s.scope():
    m = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,))]); m.compile("sgd", "mse")
    opt_in = m.optimizer
m.fit(np.ones((8, 3)), np.ones((8, 2)), batch_size=4, epochs=1, verbose=0)
m.evaluate(np.ones((8, 3)), np.ones((8, 2)), verbose=0)
assert s.stats()["steps"] == 2 and "apply_gradients" in vars(opt_in) and "evaluate" in vars(m)
assert all(a is b for a, b in zip(methods(), stock)), [f for f, g in zip(methods(), stock) if f is not g]
assert lso.strategy_supports_loss_scaling()  # the one module-level hook: tf-keras's answer outside the scope
print("WEIGHTS", json.dumps([train_outside(False), train_outside(True)]))
assert all(a is b for a, b in zip(methods(), stock))
"""
)

_WITHOUT = (
    _PREAMBLE
    + """
import sys
print("WEIGHTS", json.dumps([train_outside(False), train_outside(True)]))
assert not any(k.startswith("tf_commopt") for k in sys.modules)
"""
)


def _run_side_by_side(*codes):
    """Run each program in its own interpreter, all at once; the WEIGHTS line each printed."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT, CUDA_VISIBLE_DEVICES="")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for code in codes
    ]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        lines = [ln for ln in stdout.splitlines() if ln.startswith("WEIGHTS")]
        assert proc.returncode == 0 and len(lines) == 1, stdout[-2000:] + stderr[-3000:]
        out.append(lines[0])
    return out


def test_a_model_built_outside_the_scope_is_stock_tf_keras_after_the_strategy_trained():
    with_sc, without = _run_side_by_side(_WITH_SC, _WITHOUT)
    assert with_sc == without  # bit-identical weights (printed exactly), stock class methods
