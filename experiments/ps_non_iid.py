"""Skip-and-correct on a parameter-server cluster with label-skewed shards: correction none vs vrl (or gradient).

Runs on every task of a TF_CONFIG cluster with ps tasks (workers and ps serve); the chief trains a
784-64-10 MLP on the bundled MNIST split over the workers by label (``split_non_iid``), once with
``correction=none`` (local SGD) and once with ``vrl``, from the same initial weights, and prints one
JSON line per correction with the test accuracy after every fifth of the rounds. ``--optimizer=adam``
(rmsprop, adagrad) runs that optimizer's local steps (``compile(optimizer=...)``) and compares
``none`` with ``gradient`` (``--corrections`` to choose).

Example:
    python -m tf_commopt.cluster --workers 2 --ps 1 --chief -- \\
        python -m experiments.ps_non_iid --interval=16 --learning_rate=0.1 --rounds=25
"""

from __future__ import annotations

import json
import sys

from absl import flags, logging  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("interval", 16, "local steps per round (H)")
flags.DEFINE_float("learning_rate", 0.1, "learning rate (SGD: no momentum)")
flags.DEFINE_string(
    "optimizer", "sgd", "sgd, adam, rmsprop or adagrad (tf-keras defaults but the learning rate)"
)
flags.DEFINE_string(
    "corrections",
    "",
    "comma-separated corrections to compare; default none,vrl for sgd, none,gradient otherwise",
)
flags.DEFINE_integer("rounds", 25, "rounds per correction (a multiple of 5)")
flags.DEFINE_integer("batch_size", 32, "batch per shard and step")
flags.DEFINE_integer("classes_per_shard", 5, "labels per shard (split_non_iid)")
flags.DEFINE_integer("seed", 0, "data split, order and initial weights")


def main(argv) -> None:
    del argv
    import logging as pylogging

    logging.set_verbosity(logging.WARNING)  # the coordinator logs every join at INFO
    pylogging.getLogger("tensorflow").setLevel(pylogging.WARNING)
    import numpy as np

    from experiments.optimizers import build_optimizer, validate_optimizer
    from tf_commopt.distribute import ps as psc
    from tf_commopt.distribute.correction import validate_correction
    from tf_commopt.errors import TfCommoptError

    try:
        opt_name = validate_optimizer(FLAGS.optimizer)
        corrections = (
            FLAGS.corrections.split(",")
            if FLAGS.corrections
            else ["none", "vrl" if opt_name == "sgd" else "gradient"]
        )
        for c in corrections:
            validate_correction(c, where="--corrections")
        tfc = psc.serve_unless_chief()
    except TfCommoptError as e:
        sys.exit(f"experiments.ps_non_iid: error: {e}")
    import tensorflow as tf
    import tf_keras

    from tf_commopt.datasets import load_dataset, split_non_iid

    d = load_dataset("mnist", seed=FLAGS.seed)
    x, xt = d.x_train.reshape(len(d.x_train), -1), d.x_test.reshape(len(d.x_test), -1)
    k = tfc.num_workers
    rng = np.random.RandomState(FLAGS.seed)
    shards = [
        rng.permutation(ix) for ix in split_non_iid(d.y_train, k, FLAGS.classes_per_shard, seed=FLAGS.seed)
    ]
    strategy = tf.distribute.ParameterServerStrategy(tf.distribute.cluster_resolver.TFConfigClusterResolver())
    loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    every = max(1, FLAGS.rounds // 5)
    for corr in corrections:
        sgd = opt_name == "sgd"  # SGD: the constructor's rule (lr exactly as given)
        t = psc.ParameterServerSkipCorrect(
            interval=FLAGS.interval,
            correction=corr,
            strategy=strategy,
            learning_rate=FLAGS.learning_rate if sgd else None,
        )
        with t.scope():
            tf_keras.utils.set_random_seed(FLAGS.seed)
            model = tf_keras.Sequential(
                [tf_keras.layers.Dense(64, activation="relu", input_shape=(784,)), tf_keras.layers.Dense(10)]
            )
        t.compile(
            model,
            loss=loss,
            batch_fn=psc.array_batch_fn(x, d.y_train, k, FLAGS.batch_size, shard_indices=shards),
            optimizer=None if sgd else build_optimizer(opt_name, FLAGS.learning_rate),
        )
        accs = []
        for r in range(FLAGS.rounds):
            t.run_round()
            if (r + 1) % every == 0:
                w = model.get_weights()
                logits = np.maximum(xt @ w[0] + w[1], 0) @ w[2] + w[3]
                accs.append(round(float(np.mean(logits.argmax(1) == d.y_test)), 4))
        print(
            json.dumps(
                {
                    "optimizer": opt_name,
                    "correction": t.correction,
                    "interval": FLAGS.interval,
                    "learning_rate": FLAGS.learning_rate,
                    "rounds": FLAGS.rounds,
                    "workers": k,
                    "classes_per_shard": FLAGS.classes_per_shard,
                    "test_accuracy": accs,
                    **{key: t.stats()[key] for key in ("comm_s", "bytes_communicated")},
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    from experiments import _cli

    _cli.run(main)
