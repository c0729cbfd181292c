"""The correction with every optimizer on label-skewed shards (issue 13): SSGD vs plain local SGD vs the
default correction, for SGD, momentum and Adam, at H = 16 and 64.

One process, ``--replicas`` logical CPU replicas (accuracy, not speed, is measured here). Replica i
trains only on its shard of the bundled MNIST (``tf_commopt.datasets.split_non_iid``: each shard holds
``--classes_per_shard`` labels mostly); every global batch is the concatenation of one batch from each
shard, which tf-keras splits back into the replicas' slices. Variants: ``ssgd`` (MirroredStrategy),
``none`` (SkipCorrectStrategy, plain local SGD), ``auto`` (the default correction: vrl for plain SGD,
the gradient-space control variate otherwise). Test accuracy of the (averaged) model after ``--steps``
steps on the 1,000 held-out images, mean over ``--seeds``.

Example:
    python -m experiments.correction_bench --out=docs/results/correction.jsonl
    python -m experiments.correction_report docs/results/correction.jsonl docs/results/correction.md
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Dict, List

from absl import flags  # noqa: E402

from experiments._cli import fail, run  # noqa: E402

OPTIMIZERS = {"sgd": 0.05, "momentum": 0.01, "adam": 0.001}  # name -> learning rate
VARIANTS = ("ssgd", "none", "auto")

FLAGS = flags.FLAGS
flags.DEFINE_list("optimizers", list(OPTIMIZERS), f"any of {', '.join(OPTIMIZERS)}")
flags.DEFINE_list("intervals", ["16", "64"], "H values")
flags.DEFINE_list("variants", list(VARIANTS), f"any of {', '.join(VARIANTS)}")
flags.DEFINE_integer("replicas", 4, "logical CPU replicas")
flags.DEFINE_integer("classes_per_shard", 2, "labels per shard (label skew)")
flags.DEFINE_integer("steps", 400, "training steps")
flags.DEFINE_integer("per_replica_batch", 32, "examples per replica per step")
flags.DEFINE_list("seeds", ["0", "1"], "seeds (weights, shard split, order)")
flags.DEFINE_string("model", "mlp", "experiments.models name")
flags.DEFINE_bool(
    "average_optimizer_state",
    False,
    "skip-and-correct variants: also average the optimizer slots at each sync",
)
flags.DEFINE_string("out", "", "append one JSON record per run to this .jsonl")


def main(argv: List[str]) -> None:
    for name, allowed in (("optimizers", OPTIMIZERS), ("variants", VARIANTS)):
        bad = [v for v in getattr(FLAGS, name) if v not in allowed]
        if bad:
            fail(f"--{name}: unknown {', '.join(bad)}; choose from {', '.join(allowed)}")
    try:
        intervals = [int(h) for h in FLAGS.intervals]
        seeds = [int(s) for s in FLAGS.seeds]
    except ValueError as e:
        fail(f"--intervals/--seeds must be integers ({e})")
    if any(h < 1 for h in intervals) or FLAGS.replicas < 2 or FLAGS.steps < 1 or FLAGS.classes_per_shard < 1:
        fail("--intervals must be >= 1, --replicas >= 2, --steps >= 1, --classes_per_shard >= 1")

    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * FLAGS.replicas)
    import tf_keras as k

    from experiments.models import build_model
    from tf_commopt._compat import fresh_mirrored_strategy
    from tf_commopt.datasets import load_dataset, split_non_iid
    from tf_commopt.distribute import SkipCorrectStrategy

    devices = [d.name for d in tf.config.list_logical_devices("CPU")][: FLAGS.replicas]

    def strategy_for(variant: str, h: int):
        if variant == "ssgd":
            return fresh_mirrored_strategy(devices)
        return SkipCorrectStrategy(
            interval=h,
            correction=variant,
            devices=devices,
            average_optimizer_state=FLAGS.average_optimizer_state,
        )

    def optimizer(name: str):
        lr = OPTIMIZERS[name]
        if name == "adam":
            return k.optimizers.Adam(lr)
        return k.optimizers.SGD(lr, momentum=0.9 if name == "momentum" else 0.0)

    for seed in seeds:
        data = load_dataset("mnist", seed=seed)
        shards = split_non_iid(data.y_train, FLAGS.replicas, FLAGS.classes_per_shard, seed=seed)
        b = FLAGS.per_replica_batch

        def dataset():
            parts = [
                tf.data.Dataset.from_tensor_slices((data.x_train[idx], data.y_train[idx]))
                .shuffle(len(idx), seed=seed + i)
                .repeat()
                .batch(b, drop_remainder=True)
                for i, idx in enumerate(shards)
            ]
            return (
                tf.data.Dataset.zip(tuple(parts))
                .map(lambda *xy: (tf.concat([p[0] for p in xy], 0), tf.concat([p[1] for p in xy], 0)))
                .prefetch(2)
            )

        for opt_name in FLAGS.optimizers:
            for variant in FLAGS.variants:
                for h in [1] if variant == "ssgd" else intervals:
                    strategy = strategy_for(variant, h)
                    k.utils.set_random_seed(seed)
                    with strategy.scope():
                        model = build_model(FLAGS.model, data.input_shape, data.num_classes)
                        model.compile(
                            optimizer(opt_name),
                            k.losses.SparseCategoricalCrossentropy(from_logits=True),
                            metrics=["accuracy"],
                        )
                    t0 = time.perf_counter()
                    model.fit(dataset(), epochs=1, steps_per_epoch=FLAGS.steps, verbose=0)
                    wall = time.perf_counter() - t0
                    if hasattr(strategy, "sync"):
                        strategy.sync()
                    plain = build_model(FLAGS.model, data.input_shape, data.num_classes)
                    plain.set_weights(model.get_weights())
                    plain.compile(
                        loss=k.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]
                    )
                    _, acc = plain.evaluate(data.x_test, data.y_test, batch_size=500, verbose=0)
                    rec: Dict[str, Any] = {
                        "optimizer": opt_name,
                        "learning_rate": OPTIMIZERS[opt_name],
                        "variant": variant,
                        "interval": h,
                        "seed": seed,
                        "test_accuracy": round(float(acc), 4),
                        "wall_s": round(wall, 2),
                        "replicas": FLAGS.replicas,
                        "classes_per_shard": FLAGS.classes_per_shard,
                        "steps": FLAGS.steps,
                        "per_replica_batch": b,
                        "model": FLAGS.model,
                        "average_optimizer_state": FLAGS.average_optimizer_state,
                        "command": "python -m experiments.correction_bench " + " ".join(sys.argv[1:]),
                    }
                    if hasattr(strategy, "stats"):
                        st = strategy.stats()
                        rec.update(
                            syncs=st["syncs"],
                            bytes_communicated=st["bytes_communicated"],
                            rule=strategy.extended.correction_state(model.optimizer).rule,
                        )
                    print(json.dumps(rec), flush=True)
                    if FLAGS.out:
                        with open(FLAGS.out, "a", encoding="utf-8") as f:
                            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    run(main)
