"""``--strategy=tf_ps_async`` of the runner: TensorFlow's own parameter-server training as a baseline,
tf-keras ``model.fit`` under ``tf.distribute.ParameterServerStrategy`` (asynchronous SGD).

Every task runs the runner; worker and ps tasks serve, the chief trains and prints the record. Each step
is one closure (one batch of ``--batch_size`` from the worker's own shuffled copy of the training set)
whose gradient is applied to the ps variables when it finishes; the chief prints ``EPOCH e loss x`` after
each epoch (a bench can act on it, e.g. kill a worker).

Example::

    python -m tf_commopt.cluster --workers 2 --ps 1 --chief --tolerate-worker-failures -- \\
        python -m experiments.train --strategy=tf_ps_async --model=mlp --epochs=5 --steps_per_epoch=320 \\
        --batch_size=32 --learning_rate=0.1 --momentum=0
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Dict, Optional, TextIO, Tuple

from experiments.collective import load_data, schedule
from experiments.config import Config
from experiments.record import build_record, save_result

__all__ = ["run_tf_ps"]


def run_tf_ps(cfg: Config, out: Optional[TextIO] = None) -> Tuple[Dict[str, Any], Any]:
    """Train with ``model.fit`` under ParameterServerStrategy on this TF_CONFIG cluster.

    Returns (record, plain model with the trained weights) on the chief; never returns on workers/ps.
    """
    from tf_commopt.distribute.ps import serve_unless_chief

    out = out or sys.stdout
    tfc = serve_unless_chief()
    import tensorflow as tf
    import tf_keras

    from experiments.models import build_model, param_bytes
    from experiments.optimizers import build_optimizer

    data = load_data(cfg)
    tf_keras.utils.set_random_seed(cfg.seed)
    strategy = tf.distribute.ParameterServerStrategy(tf.distribute.cluster_resolver.TFConfigClusterResolver())
    loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with strategy.scope():
        model = build_model(cfg.model, data.input_shape, data.num_classes)
        model.compile(
            build_optimizer(cfg.optimizer, cfg.learning_rate, cfg.momentum), loss, metrics=["accuracy"]
        )
    x, y, seed, batch = data.x_train, data.y_train, cfg.seed, cfg.batch_size

    def dataset_fn(ctx):
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=seed).repeat()
        return ds.batch(batch, drop_remainder=True).prefetch(2)

    def epoch_line(epoch: int, logs: Any = None) -> None:
        print(f"EPOCH {epoch + 1} loss {(logs or {}).get('loss', float('nan')):.4f}", file=out, flush=True)

    epochs, steps_per_epoch = schedule(cfg, len(x))
    print(
        f"tf_ps_async: {cfg.model} on {cfg.dataset}, {tfc.num_workers} workers + {tfc.num_ps} ps, "
        f"batch {batch} per closure, {epochs} x {steps_per_epoch} steps",
        file=out,
        flush=True,
    )
    t0 = time.perf_counter()
    hist = model.fit(
        tf_keras.utils.experimental.DatasetCreator(dataset_fn),
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        callbacks=[tf_keras.callbacks.LambdaCallback(on_epoch_end=epoch_line)],
        verbose=0,
    )
    wall = time.perf_counter() - t0
    plain = build_model(cfg.model, data.input_shape, data.num_classes)
    plain.set_weights(model.get_weights())
    plain.compile(loss=loss, metrics=["accuracy"])
    test_loss, test_acc = plain.evaluate(data.x_test, data.y_test, batch_size=500, verbose=0)
    record = build_record(
        strategy=cfg.strategy,
        model=cfg.model,
        dataset=cfg.dataset,
        replicas=tfc.num_workers,
        workers=tfc.num_workers + 1,
        global_batch_size=batch,
        steps=epochs * steps_per_epoch,
        epochs=epochs,
        wall_s=wall,
        train_loss=hist.history["loss"][-1],
        train_accuracy=hist.history["accuracy"][-1],
        test_loss=test_loss,
        test_accuracy=test_acc,
        seed=cfg.seed,
        learning_rate=cfg.learning_rate,
        params=plain.count_params(),
        param_bytes=param_bytes(plain),
        extra={"ps": tfc.num_ps},
    )
    save_result(cfg.model_dir, record, plain)
    print(json.dumps(record), file=out, flush=True)
    return record, plain
