"""The program every task of the parameter-server tests runs (worker/ps serve; the chief trains).

``python tests/cluster/_ps_job.py exact`` trains a linear tf-keras model (3 -> 2, MSE) on fixed data with
several (interval, correction, momentum) settings on one ParameterServerStrategy and prints one JSON
line per setting with the initial and per-round global weights. ``kill ROUNDS`` trains one setting for
ROUNDS rounds, printing ``ROUND <r>`` after each (the test SIGKILLs a worker after a few), then one JSON
line. The numpy reference lives in test_parameter_server.py.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

SHARDS, BATCH, N, LR = 2, 4, 24, 0.1
SETTINGS = [(1, "none", 0.0), (1, "vrl", 0.5), (3, "none", 0.0), (3, "vrl", 0.0), (3, "vrl", 0.5)]


def data():
    rng = np.random.RandomState(0)
    x = rng.randn(N, 3).astype(np.float32)
    y = (x @ rng.randn(3, 2) + 0.3 * rng.randn(N, 2)).astype(np.float32)
    return x, y


def build(trainer, seed):
    import tf_keras

    from tf_commopt.distribute import ps

    with trainer.scope():
        init = tf_keras.initializers.RandomNormal(seed=seed)
        model = tf_keras.Sequential(
            [tf_keras.layers.Dense(2, input_shape=(3,), kernel_initializer=init, bias_initializer=init)]
        )
    x, y = data()
    trainer.compile(
        model,
        loss=tf_keras.losses.MeanSquaredError(),
        batch_fn=ps.array_batch_fn(x, y, num_shards=SHARDS, batch_size=BATCH),
    )
    return model


def weights(model):
    return [w.tolist() for w in model.get_weights()]


def main(argv):
    from tf_commopt.distribute import ps
    from tf_commopt.errors import ClusterError

    ps.serve_unless_chief()
    import tensorflow as tf

    strategy = tf.distribute.ParameterServerStrategy(tf.distribute.cluster_resolver.TFConfigClusterResolver())
    if argv[1] == "exact":
        for k, (h, corr, mom) in enumerate(SETTINGS):
            t = ps.ParameterServerSkipCorrect(
                interval=h,
                correction=corr,
                learning_rate=LR,
                momentum=mom,
                strategy=strategy,
                round_timeout_s=60,
            )
            model = build(t, seed=k)
            rec = {"interval": h, "correction": corr, "momentum": mom, "init": weights(model), "rounds": []}
            for _ in range(4):
                r = t.run_round()
                rec["rounds"].append({"weights": weights(model), "workers": r["workers"]})
            rec["corrections"] = [c.tolist() for c in t.corrections()]
            rec["stats"] = t.stats()
            print("RESULT " + json.dumps(rec), flush=True)
    elif argv[1] == "kill":
        rounds = int(argv[2])
        t = ps.ParameterServerSkipCorrect(
            interval=2,
            correction="vrl",
            learning_rate=LR,
            strategy=strategy,
            round_timeout_s=float(argv[3]) if len(argv) > 3 else 60,
        )
        model = build(t, seed=7)
        rec = {"interval": 2, "correction": "vrl", "momentum": 0.0, "init": weights(model), "rounds": []}
        for r in range(rounds):
            try:
                out = t.run_round()
            except ClusterError as e:
                print("PARTIAL " + json.dumps(rec), flush=True)
                print(f"ERROR {e}", flush=True)
                sys.exit(3)
            rec["rounds"].append({"weights": weights(model), "workers": out["workers"]})
            print(f"ROUND {r} workers {out['workers']}", flush=True)
            time.sleep(0.3)
        print("RESULT " + json.dumps(rec), flush=True)
    elif (
        argv[1] == "resume"
    ):  # resume ROUNDS DIR: restore the newest save in DIR, train, save after every round
        rounds, directory = int(argv[2]), argv[3]
        t = ps.ParameterServerSkipCorrect(
            interval=2,
            correction="vrl",
            learning_rate=LR,
            momentum=0.5,
            strategy=strategy,
            round_timeout_s=30,
        )
        model = build(t, seed=7)
        init = weights(model)
        first = t.restore_latest(directory)
        print(f"RESUMED {first}", flush=True)
        rec = {
            "interval": 2,
            "correction": "vrl",
            "momentum": 0.5,
            "init": init,
            "first": first,
            "rounds": [],
        }
        for r in range(first, rounds):
            try:
                out = t.run_round()
            except ClusterError as e:
                print(f"ERROR {e}", flush=True)
                sys.exit(3)
            t.save(directory)
            rec["rounds"].append({"weights": weights(model), "workers": out["workers"]})
            print(f"ROUND {r} workers {out['workers']}", flush=True)
            time.sleep(0.3)
        print("RESULT " + json.dumps(rec), flush=True)


if __name__ == "__main__":
    main(sys.argv)
