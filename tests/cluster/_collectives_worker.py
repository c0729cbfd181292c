"""One worker of the "no collective between syncs" cluster test (started by tf_commopt.cluster.run_cluster).

Usage: python tests/cluster/_collectives_worker.py DUMP_DIR
Runs SkipCorrectStrategy(interval=4) in model.fit (loss + accuracy metrics) and in a custom loop (a
Mean metric updated and read every step) in stages of steps, with TensorFlow's debugger (tfdbg v2)
recording every op the traced step functions actually execute. After each stage it prints one JSON
line: the stage, its steps, and the collective ops executed inside the step functions during it.
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
from tensorflow.python.debug.lib import debug_events_reader  # noqa: E402

from tf_commopt.distribute import SkipCorrectStrategy  # noqa: E402

H, GLOBAL_BATCH = 4, 16


def main(dump_dir: str) -> None:
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    root = os.path.join(dump_dir, f"worker{task}")
    writer = tf.debugging.experimental.enable_dump_debug_info(
        root, tensor_debug_mode="NO_TENSOR", circular_buffer_size=-1
    )
    strategy = SkipCorrectStrategy(interval=H, correction="vrl")
    with strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.layers.Dense(8, activation="relu", input_shape=(6,)), tf.keras.layers.Dense(3)]
        )
        model.compile(
            tf.keras.optimizers.SGD(0.1),
            tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    rng = np.random.RandomState(task)
    x, y = rng.rand(256, 6).astype(np.float32), rng.randint(0, 3, 256)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH // 2).repeat()

    seen = {"n": 0}

    def collectives(graph_marker: str):
        writer.FlushNonExecutionFiles()
        writer.FlushExecutionFiles()
        with debug_events_reader.DebugDataReader(root) as reader:
            reader.update()
            traces = reader.graph_execution_traces()
            new, seen["n"] = traces[seen["n"] :], len(traces)
            out = {}
            for t in new:
                if not t.op_type.startswith("Collective"):
                    continue
                g, chain = reader.graph_by_id(t.graph_id), []
                while g is not None:
                    chain.append(str(g.name))
                    g = reader.graph_by_id(g.outer_graph_id) if g.outer_graph_id else None
                if any(graph_marker in c for c in chain):
                    out[t.op_type] = out.get(t.op_type, 0) + 1
            return out

    def report(stage, steps, marker, history=None):
        print(
            json.dumps(
                {
                    "stage": stage,
                    "steps": steps,
                    "syncs": strategy.stats()["syncs"],
                    "collectives": collectives(marker),
                    "history": history,
                }
            ),
            flush=True,
        )

    # model.fit: steps 1-3 local, step 4 syncs, steps 5-7 local
    for stage, n in (("fit_local_1", 3), ("fit_sync", 1), ("fit_local_2", 3)):
        h = model.fit(ds, epochs=1, steps_per_epoch=n, verbose=0)
        report(stage, n, "train_function", h.history)

    # custom loop (the local-step counter carries over): step 8 syncs, 9-11 local, 12 syncs, 13 local
    with strategy.scope():
        opt = model.optimizer
        mean_loss = tf.keras.metrics.Mean()
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    it = iter(strategy.experimental_distribute_dataset(ds))

    @tf.function
    def custom_step(batch):
        def fn(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(
                    loss_fn(yb, model(xb, training=True)), global_batch_size=GLOBAL_BATCH
                )
            opt.apply_gradients(
                zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
            )
            mean_loss.update_state(loss)
            return mean_loss.result()

        return strategy.run(fn, args=batch)

    for stage, n in (
        ("custom_sync_1", 1),
        ("custom_local_1", 3),
        ("custom_sync_2", 1),
        ("custom_local_2", 1),
    ):
        for _ in range(n):
            custom_step(next(it))
        report(stage, n, "custom_step")


if __name__ == "__main__":
    main(sys.argv[1])
