"""The program every task of tests/cluster/test_ps_fit.py runs (worker/ps serve; the chief trains with fit).

``exact``: for each setting of SETTINGS, ``model.fit`` (through ``ps.wrap``) on arrays, the same with
a ``dataset_fn(input_context)``, and the low-level ``run_round`` with the same round lengths, each from
the same initial weights; prints one JSON line per setting with the global weights after every round.
``auto``: fit with ``interval="auto"`` (Adam, correction auto = gradient). ``kill EPOCHS``: fit printing
``ROUND <r>`` after every round (the test SIGKILLs a worker), then one JSON line.
The numpy reference lives in test_ps_fit.py.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

SHARDS, BATCH, N = 2, 4, 24  # per-shard batch 4 (global 8); 12 rows per shard = 3 batches
# (name, optimizer kwargs, interval, steps_per_epoch, epochs, correction)
SETTINGS = [
    ("sgd", {"learning_rate": 0.1}, 3, 5, 2, "auto"),  # auto -> vrl
    ("sgd_momentum", {"learning_rate": 0.05, "momentum": 0.5}, 3, 5, 2, "auto"),  # auto -> gradient
    ("adam", {"learning_rate": 0.05}, 3, 5, 2, "auto"),  # auto -> gradient
    ("adam", {"learning_rate": 0.05}, 1, 3, 2, "none"),  # H = 1, none: synchronous Adam
]


def data():
    rng = np.random.RandomState(0)
    x = rng.randn(N, 3).astype(np.float32)
    y = (x @ rng.randn(3, 2) + 0.3 * rng.randn(N, 2)).astype(np.float32)
    return x, y


def make_optimizer(name, kwargs):
    import tf_keras

    cls = tf_keras.optimizers.Adam if name == "adam" else tf_keras.optimizers.SGD
    return cls(**kwargs)


def build(trainer, seed, name, kwargs):
    import tf_keras

    with trainer.scope():
        init = tf_keras.initializers.RandomNormal(seed=seed)
        model = tf_keras.Sequential(
            [tf_keras.layers.Dense(2, input_shape=(3,), kernel_initializer=init, bias_initializer=init)]
        )
        model.compile(
            optimizer=make_optimizer(name, kwargs),
            loss="mse",
            metrics=["mae", tf_keras.metrics.CategoricalAccuracy(name="acc"), tf_keras.metrics.AUC()],
        )
    return model


def weights(model):
    return [w.tolist() for w in model.get_weights()]


def dataset_fn(ctx):
    import tensorflow as tf

    x, y = data()
    k, i = ctx.num_input_pipelines, ctx.input_pipeline_id
    bsz = ctx.get_per_replica_batch_size(BATCH * SHARDS)
    return tf.data.Dataset.from_tensor_slices((x[i::k], y[i::k])).batch(bsz).repeat()


def dataset_fn_from_step(ctx, step):
    """The same batches as dataset_fn, started at ``step`` (nothing to skip): batch t = rows (tB .. tB+B-1) mod n."""
    import tensorflow as tf

    x, y = data()
    k, i = ctx.num_input_pipelines, ctx.input_pipeline_id
    bsz = ctx.get_per_replica_batch_size(BATCH * SHARDS)
    xs, ys = tf.constant(x[i::k]), tf.constant(y[i::k])
    n = len(x) // k

    def batch(t):
        rows = tf.math.floormod(t * bsz + tf.range(bsz, dtype=tf.int64), n)
        return tf.gather(xs, rows), tf.gather(ys, rows)

    return tf.data.Dataset.range(step, 2**62).map(batch)


class Recorder:
    """A Keras callback that records the global weights after every round (one batch-end per round)."""

    def __init__(self, model, trainer, echo=False):
        import tf_keras

        outer = self

        class _CB(tf_keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                rec = trainer.history[-1]
                outer.rounds.append(
                    {
                        "weights": weights(model),
                        "workers": rec["workers"],
                        "steps": rec["steps"],
                        "batch": batch,
                        "loss": logs["loss"],
                    }
                )
                if echo:
                    print(f"ROUND {len(outer.rounds) - 1} workers {rec['workers']}", flush=True)
                    time.sleep(0.3)

            def on_epoch_end(self, epoch, logs=None):
                outer.epochs.append(epoch)

        self.rounds, self.epochs, self.callback = [], [], _CB()


def main(argv):
    from tf_commopt.distribute import ps

    ps.serve_unless_chief()
    import tensorflow as tf

    strategy = tf.distribute.ParameterServerStrategy(tf.distribute.cluster_resolver.TFConfigClusterResolver())
    x, y = data()
    for mode in argv[1:2] if argv[1] == "kill" else argv[1:]:  # "exact auto": both on one cluster
        run_mode(mode, argv, strategy, x, y)


def run_mode(mode, argv, strategy, x, y):
    """Run one mode of the job on the cluster's chief and print its records."""
    import tensorflow as tf
    import tf_keras

    from tf_commopt.distribute import ps
    from tf_commopt.errors import InputError

    if mode == "exact":
        for k, (name, kwargs, h, spe, epochs, corr) in enumerate(SETTINGS):
            rec = {"name": name, "kwargs": kwargs, "interval": h, "spe": spe}
            # 1. model.fit on arrays (wrapped instance)
            t = ps.ParameterServerSkipCorrect(
                interval=h, correction=corr, strategy=strategy, round_timeout_s=60
            )
            model = ps.wrap(build(t, k, name, kwargs))
            rec["init"] = weights(model)
            r = Recorder(model, t)
            hist = model.fit(
                x,
                y,
                batch_size=BATCH * SHARDS,
                epochs=epochs,
                steps_per_epoch=spe,
                shuffle=False,
                verbose=2 if k == 0 else 0,
                callbacks=[r.callback],
                validation_data=(x[:10], y[:10]),
            )
            rec.update(
                correction=t.correction,
                fit=r.rounds,
                epochs=r.epochs,
                history=hist.history,
                iterations=int(model.optimizer.iterations.numpy()),
                corrections=[c.tolist() for c in t.corrections()],
                stats=t.stats(),
                stock_fit=type(model).fit is tf_keras.Model.fit,
                evaluate=model.evaluate(x, y, batch_size=N, verbose=0),
                predict=model.predict(x[:3], verbose=0).tolist(),
            )
            # 2. the same with a dataset function per shard
            t2 = ps.ParameterServerSkipCorrect(
                interval=h, correction=corr, strategy=strategy, round_timeout_s=60
            )
            model2 = build(t2, k, name, kwargs)
            r2 = Recorder(model2, t2)
            ps.fit(model2, dataset_fn, epochs=epochs, steps_per_epoch=spe, verbose=0, callbacks=[r2.callback])
            rec["dataset_fn"] = r2.rounds
            if k == 0:  # dataset_fn(input_context, step): starts at the shard's step, nothing skipped
                t4 = ps.ParameterServerSkipCorrect(
                    interval=h, correction=corr, strategy=strategy, round_timeout_s=60
                )
                model4 = build(t4, k, name, kwargs)
                r4 = Recorder(model4, t4)
                ps.fit(
                    model4,
                    dataset_fn_from_step,
                    epochs=epochs,
                    steps_per_epoch=spe,
                    verbose=0,
                    callbacks=[r4.callback],
                )
                rec["dataset_fn_step"] = r4.rounds
            # 3. the low-level API with the same round lengths
            t3 = ps.ParameterServerSkipCorrect(
                interval=h, correction=corr, strategy=strategy, round_timeout_s=60
            )
            model3 = build(t3, k, name, kwargs)
            t3.compile(
                model3,
                loss=tf_keras.losses.MeanSquaredError(),
                optimizer=make_optimizer(name, kwargs),
                batch_fn=ps.array_batch_fn(x, y, num_shards=SHARDS, batch_size=BATCH),
            )
            rec["run_round"] = []
            for q in r.rounds:
                t3.run_round(steps=q["steps"])
                rec["run_round"].append({"weights": weights(model3)})
            print("RESULT " + json.dumps(rec), flush=True)
    elif mode == "auto":
        t = ps.ParameterServerSkipCorrect(
            interval="auto", strategy=strategy, round_timeout_s=60, max_interval=4
        )
        model = ps.wrap(build(t, 5, "adam", {"learning_rate": 0.05}))
        with t.scope():
            regularized = tf_keras.Sequential(
                [tf_keras.layers.Dense(2, input_shape=(3,), kernel_regularizer="l2")]
            )
            regularized.compile(optimizer="sgd", loss="mse")
        errors = {}  # bad input: one line naming the argument, before anything is traced
        for label, call in [
            ("dataset", lambda: model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8))),
            ("batch_size", lambda: model.fit(x, y, batch_size=7)),
            ("steps_per_epoch", lambda: model.fit(dataset_fn)),
            ("y", lambda: model.fit(dataset_fn, y, steps_per_epoch=2)),
            ("callbacks", lambda: model.fit(x, y, callbacks=[tf_keras.callbacks.BackupAndRestore("/tmp/b")])),
            ("epochs", lambda: model.fit(x, y, epochs=0)),
            ("compile", lambda: ps.fit(regularized, x, y, batch_size=8)),
        ]:
            try:
                call()
                errors[label] = None
            except InputError as e:
                errors[label] = str(e)
        print("ERRORS " + json.dumps(errors), flush=True)
        rec = {"name": "adam", "kwargs": {"learning_rate": 0.05}, "init": weights(model)}
        r = Recorder(model, t)
        hist = model.fit(
            x,
            y,
            batch_size=BATCH * SHARDS,
            epochs=3,
            steps_per_epoch=7,
            shuffle=False,
            verbose=0,
            callbacks=[r.callback],
        )
        rec.update(
            correction=t.correction,
            fit=r.rounds,
            history=hist.history,
            stats=t.stats(),
            traces=t.auto_traces if hasattr(t, "auto_traces") else None,
        )
        print("RESULT " + json.dumps(rec), flush=True)
    elif mode == "kill":
        epochs = int(argv[2])
        t = ps.ParameterServerSkipCorrect(interval=2, strategy=strategy, round_timeout_s=60)
        model = ps.wrap(build(t, 7, "adam", {"learning_rate": 0.05}))
        rec = {"name": "adam", "kwargs": {"learning_rate": 0.05}, "init": weights(model)}
        r = Recorder(model, t, echo=True)
        model.fit(
            x,
            y,
            batch_size=BATCH * SHARDS,
            epochs=epochs,
            steps_per_epoch=5,
            shuffle=False,
            verbose=0,
            callbacks=[r.callback],
        )
        rec.update(
            correction=t.correction,
            fit=r.rounds,
            corrections=[c.tolist() for c in t.corrections()],
            lost=sorted(t.lost_workers),
            rejoined=t.rejoined_workers,
        )
        print("RESULT " + json.dumps(rec), flush=True)


if __name__ == "__main__":
    main(sys.argv)
