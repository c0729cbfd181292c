"""Skip-and-correct on a parameter-server cluster with label-skewed shards: correction none vs vrl.

Runs on every task of a TF_CONFIG cluster with ps tasks (workers and ps serve); the chief trains a
784-64-10 MLP on the bundled MNIST split over the workers by label (``split_non_iid``), once with
``correction=none`` (local SGD) and once with ``vrl``, from the same initial weights, and prints one
JSON line per correction with the test accuracy after every fifth of the rounds.

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
flags.DEFINE_float("learning_rate", 0.1, "SGD learning rate (no momentum)")
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

    from tf_commopt.distribute import parameter_server as psc
    from tf_commopt.errors import TfCommoptError

    try:
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
    shards = [rng.permutation(ix) for ix in split_non_iid(d.y_train, k, FLAGS.classes_per_shard, seed=FLAGS.seed)]
    strategy = tf.distribute.ParameterServerStrategy(tf.distribute.cluster_resolver.TFConfigClusterResolver())
    loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    every = max(1, FLAGS.rounds // 5)
    for corr in ("none", "vrl"):
        t = psc.ParameterServerSkipCorrect(interval=FLAGS.interval, correction=corr,
                                           learning_rate=FLAGS.learning_rate, strategy=strategy)
        with t.scope():
            tf_keras.utils.set_random_seed(FLAGS.seed)
            model = tf_keras.Sequential([tf_keras.layers.Dense(64, activation="relu", input_shape=(784,)),
                                         tf_keras.layers.Dense(10)])
        t.compile(model, loss=loss, batch_fn=psc.array_batch_fn(x, d.y_train, k, FLAGS.batch_size, shard_indices=shards))
        accs = []
        for r in range(FLAGS.rounds):
            t.run_round()
            if (r + 1) % every == 0:
                w = model.get_weights()
                logits = np.maximum(xt @ w[0] + w[1], 0) @ w[2] + w[3]
                accs.append(round(float(np.mean(logits.argmax(1) == d.y_test)), 4))
        print(json.dumps({"correction": corr, "interval": FLAGS.interval, "learning_rate": FLAGS.learning_rate,
                          "rounds": FLAGS.rounds, "workers": k, "classes_per_shard": FLAGS.classes_per_shard,
                          "test_accuracy": accs, **{key: t.stats()[key] for key in ("comm_s", "bytes_communicated")}}),
              flush=True)


if __name__ == "__main__":
    from experiments import _cli

    _cli.run(main)
