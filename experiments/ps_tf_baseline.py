"""TensorFlow's own parameter-server training, as a baseline: tf-keras ``model.fit`` under
``tf.distribute.ParameterServerStrategy`` (asynchronous SGD, a dataset function per worker).

Example (every task runs it; worker and ps tasks serve, the chief trains and prints one JSON line)::

    python -m tf_commopt.cluster --workers 2 --ps 1 --chief --tolerate-worker-failures -- \\
        python -m experiments.ps_tf_baseline --steps=1600 --batch_size=32 --learning_rate=0.1

Each of the ``--steps`` steps is one closure (one batch of ``--batch_size`` from the worker's own
shuffled copy of the training set) whose gradient is applied to the ps variables when it finishes.
The chief prints ``EPOCH e`` after each of ``--epochs`` epochs (``steps / epochs`` steps each); the
benchmark kills a worker after ``EPOCH 1``. Same model (``mlp``) and data (bundled MNIST) as
``experiments.train``; the JSON line has ``wall_s, steps, test_accuracy, test_loss, train_loss``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import List

from absl import flags  # noqa: E402

from tf_commopt.errors import InputError  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("steps", 1600, "training steps (closures) in all")
flags.DEFINE_integer("epochs", 4, "the steps are split into this many epochs (an EPOCH line after each)")
flags.DEFINE_integer("batch_size", 32, "batch per step")
flags.DEFINE_float("learning_rate", 0.1, "SGD learning rate")
flags.DEFINE_string("model", "mlp", "a model of experiments.models")
flags.DEFINE_integer("seed", 0, "random seed")


def run(steps: int, epochs: int, batch_size: int, learning_rate: float, model_name: str, seed: int) -> dict:
    """Train with ``model.fit`` under ParameterServerStrategy on this TF_CONFIG cluster (chief only)."""
    for name, v in (("steps", steps), ("epochs", epochs), ("batch_size", batch_size)):
        if v < 1:
            raise InputError(f"must be >= 1, got {v}", where=f"--{name}")
    if steps % epochs:
        raise InputError(f"{steps} steps do not split into {epochs} epochs", where="--steps")
    from tf_commopt.distribute.ps import serve_unless_chief

    serve_unless_chief()
    import tensorflow as tf
    import tf_keras

    from experiments.models import build_model
    from tf_commopt.datasets import load_dataset

    data = load_dataset("mnist", seed=seed)
    tf_keras.utils.set_random_seed(seed)
    strategy = tf.distribute.ParameterServerStrategy(tf.distribute.cluster_resolver.TFConfigClusterResolver())
    with strategy.scope():
        model = build_model(model_name, data.input_shape, data.num_classes)
        model.compile(
            optimizer=tf_keras.optimizers.SGD(learning_rate),
            loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    x, y = data.x_train, data.y_train

    def dataset_fn(ctx):
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=seed).repeat()
        return ds.batch(batch_size, drop_remainder=True).prefetch(2)

    class Marks(tf_keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            print(f"EPOCH {epoch + 1} loss {logs.get('loss', float('nan')):.4f}", flush=True)

    t0 = time.perf_counter()
    hist = model.fit(
        tf_keras.utils.experimental.DatasetCreator(dataset_fn),
        epochs=epochs,
        steps_per_epoch=steps // epochs,
        callbacks=[Marks()],
        verbose=0,
    )
    wall = time.perf_counter() - t0
    plain = build_model(model_name, data.input_shape, data.num_classes)
    plain.set_weights(model.get_weights())
    plain.compile(loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    test_loss, test_acc = plain.evaluate(data.x_test, data.y_test, batch_size=500, verbose=0)
    return {
        "strategy": "tf_ps_async",
        "model": model_name,
        "steps": steps,
        "batch_size": batch_size,
        "wall_s": round(wall, 3),
        "train_loss": float(hist.history["loss"][-1]),
        "test_loss": float(test_loss),
        "test_accuracy": float(test_acc),
        "learning_rate": learning_rate,
    }


def main(argv: List[str]) -> None:
    if len(argv) > 1:
        sys.stderr.write(f"experiments.ps_tf_baseline: error: unexpected argument(s): {' '.join(argv[1:])}\n")
        sys.exit(2)
    try:
        rec = run(FLAGS.steps, FLAGS.epochs, FLAGS.batch_size, FLAGS.learning_rate, FLAGS.model, FLAGS.seed)
    except InputError as e:
        sys.stderr.write(f"experiments.ps_tf_baseline: error: {e}\n")
        sys.exit(2)
    print(json.dumps(rec), flush=True)
    sys.stdout.flush()
    os._exit(0)  # TF 2.21's coordinator can hang at exit after a worker failure (docs/parameter_server.md)


if __name__ == "__main__":
    from experiments import _cli

    _cli.run(main)
