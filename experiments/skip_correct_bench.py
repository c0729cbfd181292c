"""Skip-and-correct vs synchronous SGD on a (bandwidth-limited) local cluster: time per step and accuracy.

Each variant runs on ``--workers`` processes started by ``tf_commopt.cluster.run_cluster`` (one CPU
replica per worker, TF_CONFIG), optionally on a shaped loopback (``--bandwidth_mbit``; the cap is on
the shared segment or per link, see docs/cluster.md). Every worker trains the same model on its own
shard of the bundled MNIST: a few untimed steps first (tracing, collective set-up), then ``--steps``
timed steps; the chief evaluates the averaged model on the held-out images and prints one JSON line.

Variants: ``ssgd`` (MultiWorkerMirroredStrategy), ``local_sgd`` (SkipCorrectStrategy, correction none),
``vrl`` (correction vrl, the rule's lr), ``vrl_effective`` (vrl with lr/(1 − β)).

Example:
    python -m experiments.skip_correct_bench --workers=2 --bandwidth_mbit=20 --steps=60 \\
        --out=docs/results/skip_correct.md
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Dict, List

from absl import flags  # noqa: E402

from experiments.data import train_dataset_fn  # noqa: E402  (TensorFlow only when called)

VARIANTS = ("ssgd", "local_sgd", "vrl", "vrl_effective")
FLAGS = flags.FLAGS
flags.DEFINE_bool("worker", False, "internal: run one worker of one variant (under TF_CONFIG)")
flags.DEFINE_string("variant", "vrl", f"worker mode: one of {', '.join(VARIANTS)}")
flags.DEFINE_list("variants", list(VARIANTS), "variants to compare")
flags.DEFINE_integer("workers", 2, "worker processes")
flags.DEFINE_float("bandwidth_mbit", 20.0, "shape the cluster network to this rate (0 = no shaping)")
flags.DEFINE_string("topology", "switch", "switch or shared (see tf_commopt.cluster)")
flags.DEFINE_integer("steps", 60, "timed steps")
flags.DEFINE_integer("untimed_steps", 4, "steps before timing (tracing, collective set-up)")
flags.DEFINE_integer("interval", 4, "H for the skip-and-correct variants")
flags.DEFINE_string("model", "cnn", "experiments.models model name")
flags.DEFINE_integer("batch_size", 128, "global batch")
flags.DEFINE_float("learning_rate", 0.05, "SGD learning rate")
flags.DEFINE_float("momentum", 0.9, "SGD momentum")
flags.DEFINE_integer("seed", 0, "seed")
flags.DEFINE_integer(
    "non_iid_classes",
    0,
    "0: iid shards; k > 0: each worker mostly sees k labels (tf_commopt.datasets.split_non_iid)",
)
flags.DEFINE_string("out", "", "write a markdown table here (and a .jsonl next to it)")


def _strategy(variant: str):
    import tensorflow as tf

    if variant == "ssgd":
        return tf.distribute.MultiWorkerMirroredStrategy()
    from tf_commopt.distribute import SkipCorrectStrategy

    return SkipCorrectStrategy(
        interval=FLAGS.interval,
        correction="none" if variant == "local_sgd" else "vrl",
        correction_lr="effective" if variant == "vrl_effective" else "optimizer",
    )


def worker() -> None:
    strategy = _strategy(FLAGS.variant)
    import tf_keras

    from experiments.models import build_model
    from tf_commopt.datasets import load_dataset

    tf_keras.utils.set_random_seed(FLAGS.seed)
    data = load_dataset("mnist", seed=FLAGS.seed)
    with strategy.scope():
        model = build_model(FLAGS.model, data.input_shape, data.num_classes)
        model.compile(
            optimizer=tf_keras.optimizers.SGD(FLAGS.learning_rate, momentum=FLAGS.momentum),
            loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    train = strategy.distribute_datasets_from_function(
        train_dataset_fn(data.x_train, data.y_train, FLAGS.batch_size, FLAGS.seed, FLAGS.non_iid_classes)
    )
    marks: Dict[str, Any] = {}

    class _Timer(tf_keras.callbacks.Callback):
        """Starts the clock (and the stats baseline) after the untimed steps."""

        def on_train_batch_end(self, batch, logs=None):
            if batch == FLAGS.untimed_steps - 1:
                marks["stats"] = strategy.stats() if hasattr(strategy, "stats") else None
                if hasattr(strategy, "reset_step_clock"):
                    strategy.reset_step_clock()
                marks["t0"] = time.perf_counter()

    model.fit(
        train, epochs=1, steps_per_epoch=FLAGS.untimed_steps + FLAGS.steps, verbose=0, callbacks=[_Timer()]
    )
    wall = time.perf_counter() - marks["t0"]
    before = marks["stats"]
    after = strategy.stats() if before is not None else None  # before the final (out-of-rhythm) sync
    if hasattr(strategy, "sync"):
        strategy.sync()
    plain = build_model(FLAGS.model, data.input_shape, data.num_classes)
    plain.set_weights(model.get_weights())
    plain.compile(loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    loss, acc = plain.evaluate(data.x_test, data.y_test, batch_size=500, verbose=0)
    rec: Dict[str, Any] = {
        "variant": FLAGS.variant,
        "steps": FLAGS.steps,
        "wall_s": round(wall, 3),
        "ms_per_step": round(1000 * wall / FLAGS.steps, 2),
        "test_accuracy": round(float(acc), 4),
        "test_loss": round(float(loss), 4),
    }
    if before is not None:
        rec.update(
            {
                "interval": after["interval"],
                "syncs": after["syncs"] - before["syncs"],
                "comm_s": round(after["comm_s"] - before["comm_s"], 3),
                "bytes_per_worker": after["bytes_communicated"] - before["bytes_communicated"],
            }
        )
    if strategy.extended.should_checkpoint:
        print(json.dumps(rec), flush=True)


def parent() -> None:
    from tf_commopt.cluster import run_cluster

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows: List[Dict[str, Any]] = []
    failed: List[str] = []
    for v in FLAGS.variants:
        if v not in VARIANTS:
            print(f"--variants: unknown variant {v!r}; choose from {', '.join(VARIANTS)}", file=sys.stderr)
            sys.exit(2)
        cmd = [
            sys.executable,
            "-m",
            "experiments.skip_correct_bench",
            "--worker",
            f"--variant={v}",
            f"--steps={FLAGS.steps}",
            f"--untimed_steps={FLAGS.untimed_steps}",
            f"--interval={FLAGS.interval}",
            f"--model={FLAGS.model}",
            f"--batch_size={FLAGS.batch_size}",
            f"--learning_rate={FLAGS.learning_rate}",
            f"--momentum={FLAGS.momentum}",
            f"--seed={FLAGS.seed}",
            f"--non_iid_classes={FLAGS.non_iid_classes}",
        ]
        r = run_cluster(
            cmd,
            workers=FLAGS.workers,
            bandwidth_mbit=FLAGS.bandwidth_mbit or None,
            topology=FLAGS.topology,
            timeout=900,
            cwd=root,
            echo=False,
        )
        lines = [json.loads(line) for line in r.outputs.get("worker:0", []) if line.startswith("{")]
        if r.returncode != 0 or not lines:
            print(f"{v}: failed ({r.message}); last lines: {r.last_lines('worker:0', 5)}", file=sys.stderr)
            failed.append(v)
            continue
        rows.append(lines[-1])
        print(json.dumps(lines[-1]), flush=True)
    head = (
        f"{FLAGS.workers} workers, {FLAGS.bandwidth_mbit or 'unshaped'} Mbit/s ({FLAGS.topology}), "
        f"model {FLAGS.model}, global batch {FLAGS.batch_size}, SGD lr {FLAGS.learning_rate} momentum "
        f"{FLAGS.momentum}, H = {FLAGS.interval}, {FLAGS.steps} timed steps, seed {FLAGS.seed}, "
        + (
            f"label-skewed shards ({FLAGS.non_iid_classes} labels per worker)"
            if FLAGS.non_iid_classes
            else "iid shards"
        )
    )
    table = [
        "| variant | ms/step | test acc | test loss | syncs | comm s | bytes/worker |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        table.append(
            f"| {row['variant']} | {row['ms_per_step']} | {row['test_accuracy']} | {row['test_loss']} | "
            f"{row.get('syncs', FLAGS.steps)} | {row.get('comm_s', '')} | {row.get('bytes_per_worker', '')} |"
        )
    print(head)
    print("\n".join(table))
    if FLAGS.out:
        with open(FLAGS.out, "w", encoding="utf-8") as f:
            f.write(
                f"# Skip-and-correct vs SSGD\n\n`python -m experiments.skip_correct_bench "
                f"{' '.join(sys.argv[1:])}`\n\n{head}\n\n" + "\n".join(table) + "\n"
            )
        with open(os.path.splitext(FLAGS.out)[0] + ".jsonl", "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    if failed:  # never a silent success: the table then lacks these rows
        sys.stderr.write(
            f"skip_correct_bench: error: variant(s) {', '.join(failed)} failed and are missing "
            "from the table\n"
        )
        sys.exit(1)


def main(argv: List[str]) -> None:
    del argv
    worker() if FLAGS.worker else parent()


if __name__ == "__main__":
    from experiments import _cli

    _cli.run(main)
