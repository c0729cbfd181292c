"""Thesis 001 on a bandwidth-limited local cluster: time to accuracy of SSGD, local SGD and skip-and-correct
(fixed H and ``interval="auto"``), the compute-only bound, and the interval-selection overhead of ours vs
AdaComm-style and grid search (issue 6).

Every (setting, variant) is one launch of ``--workers`` processes by ``tf_commopt.cluster.run_cluster``
(one CPU replica per worker, TF_CONFIG, loopback shaped to the setting's Mbit/s, ``--topology``). Every
worker trains on its own shard of the bundled MNIST (IID, or label-skewed by
``tf_commopt.datasets.split_non_iid``): ``--untimed_steps`` first (tracing, collective set-up; for
``sc_auto`` they are its H = 1 warm-up), then the timed steps. Every ``--eval_every`` steps the clock
pauses, the replicas are averaged (skip-and-correct variants) and every worker evaluates the global model on
the held-out images (so the workers stay in step); the chief prints one JSON line with the curve.

Variants: ``ssgd`` (MultiWorkerMirroredStrategy), ``local_sgd`` (SkipCorrectStrategy, correction none, H),
``sc`` (vrl, H), ``sc_auto`` (vrl, interval="auto"), ``adacomm`` (vrl + AdaCommCallback), ``grid`` (vrl +
keras_grid_search before training; its trials are inside the wall time), ``compute_only`` (no
communication at all: H = 10^9, no evaluation; its wall time is the bound).

Example:
    python -m experiments.comm_bench --out=docs/results/comm.md       # the whole default matrix (~20 min)
    python -m experiments.comm_bench --settings=cnn:100:iid --variants=ssgd,sc_auto
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Dict, List

from absl import flags  # noqa: E402

from experiments.data import train_dataset_fn  # noqa: E402  (TensorFlow only when called)

VARIANTS = ("ssgd", "local_sgd", "sc", "sc_auto", "adacomm", "grid", "compute_only")
DEFAULT_SETTINGS = [  # model:mbit:split -> variants
    "cnn:100:iid=ssgd,local_sgd,sc,sc_auto,adacomm,grid,compute_only",
    "cnn:100:non_iid=ssgd,local_sgd,sc,sc_auto",
    "cnn:1000:iid=ssgd,sc,sc_auto",
    "big_mlp:1000:iid=ssgd,local_sgd,sc,sc_auto,compute_only",
]
FLAGS = flags.FLAGS
flags.DEFINE_bool("worker", False, "internal: run one worker of one variant (under TF_CONFIG)")
flags.DEFINE_string("variant", "sc_auto", "worker mode: one of " + ", ".join(VARIANTS))
flags.DEFINE_list("settings", DEFAULT_SETTINGS, "model:mbit:split[=variant,...] entries (split iid|non_iid)")
flags.DEFINE_list("variants", [], "override the variants of every setting")
flags.DEFINE_integer("workers", 4, "worker processes")
flags.DEFINE_string("topology", "switch", "switch or shared (see tf_commopt.cluster)")
flags.DEFINE_string("model", "cnn", "worker mode: experiments.models name")
flags.DEFINE_string("split", "iid", "worker mode: iid or non_iid")
flags.DEFINE_integer("steps", 0, "timed steps (0: 144 for cnn, 48 for big_mlp)")
flags.DEFINE_integer("untimed_steps", 2, "steps before the clock starts")
flags.DEFINE_integer(
    "eval_every", 0, "evaluate every this many steps (0: steps / 6, a multiple of the fixed H)"
)
flags.DEFINE_integer("interval", 4, "H of the fixed-H variants")
flags.DEFINE_integer("grid_steps", 8, "steps per grid-search trial (at least 2 H)")
flags.DEFINE_integer("batch_size", 128, "global batch")
flags.DEFINE_float("learning_rate", 0.05, "SGD learning rate")
flags.DEFINE_float("momentum", 0.9, "SGD momentum")
flags.DEFINE_integer("non_iid_classes", 2, "labels per worker in the non_iid split")
flags.DEFINE_integer("seed", 0, "seed")
flags.DEFINE_bool("append", False, "append to the .jsonl next to --out instead of starting it afresh")
flags.DEFINE_bool("report_only", False, "rewrite the page from the .jsonl next to --out without running")
flags.DEFINE_float("target_cnn", 0.9, "target test accuracy for cnn")
flags.DEFINE_float("target_big_mlp", 0.85, "target test accuracy for big_mlp")
flags.DEFINE_string("out", "", "write the results page here (a .jsonl and .png figures next to it)")


def _steps(model: str) -> int:
    return FLAGS.steps or (48 if model == "big_mlp" else 144)


def _strategy(variant: str):
    import tensorflow as tf

    if variant == "ssgd":
        return tf.distribute.MultiWorkerMirroredStrategy()
    from tf_commopt.distribute import SkipCorrectStrategy

    if variant == "compute_only":
        return SkipCorrectStrategy(interval=10**9, correction="none")
    if variant == "local_sgd":
        return SkipCorrectStrategy(interval=FLAGS.interval, correction="none")
    return SkipCorrectStrategy(
        interval="auto" if variant == "sc_auto" else FLAGS.interval, correction="vrl", max_interval=64
    )


def worker() -> None:
    if os.environ.get("COMM_BENCH_STACKS"):  # debugging aid: kill -USR1 <pid> dumps the stacks there
        import faulthandler
        import signal

        faulthandler.register(
            signal.SIGUSR1,
            file=open(os.path.join(os.environ["COMM_BENCH_STACKS"], f"stack-{os.getpid()}.txt"), "w"),
        )
    variant = FLAGS.variant
    strategy = _strategy(variant)
    import tf_keras

    from experiments.models import build_model, param_bytes
    from tf_commopt.datasets import load_dataset

    tf_keras.utils.set_random_seed(FLAGS.seed)
    data = load_dataset("mnist", seed=FLAGS.seed)
    steps = _steps(FLAGS.model)
    every = FLAGS.eval_every or max(1, steps // 6)
    loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with strategy.scope():
        model = build_model(FLAGS.model, data.input_shape, data.num_classes)
        model.compile(
            optimizer=tf_keras.optimizers.SGD(FLAGS.learning_rate, momentum=FLAGS.momentum), loss=loss_fn
        )
    plain = build_model(FLAGS.model, data.input_shape, data.num_classes)
    plain.compile(loss=loss_fn, metrics=["accuracy"])
    train = strategy.distribute_datasets_from_function(
        train_dataset_fn(
            data.x_train,
            data.y_train,
            FLAGS.batch_size,
            FLAGS.seed,
            FLAGS.non_iid_classes if FLAGS.split == "non_iid" else 0,
        )
    )
    sc = hasattr(strategy, "sync")
    clock: Dict[str, Any] = {"wall": 0.0, "t": None}
    curve: List[Dict[str, float]] = []

    def evaluate(step: int) -> None:
        if sc:
            before = strategy.stats()
            strategy.sync()
            after = strategy.stats()  # the evaluation's sync is not training: keep it out of the counts
            if "stats0" in clock:  # after the clock started
                clock["eval_syncs"] = clock.get("eval_syncs", 0) + after["syncs"] - before["syncs"]
                clock["eval_comm"] = clock.get("eval_comm", 0.0) + after["comm_s"] - before["comm_s"]
        plain.set_weights(model.get_weights())
        loss, acc = plain.evaluate(data.x_test, data.y_test, batch_size=500, verbose=0)
        curve.append(
            {
                "step": step,
                "wall_s": round(clock["wall"], 3),
                "test_loss": round(float(loss), 4),
                "test_accuracy": round(float(acc), 4),
            }
        )
        if sc:
            strategy.reset_step_clock()

    class _Clock(tf_keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            b = batch + 1 - FLAGS.untimed_steps  # timed steps done
            if b == 0:
                clock["t"] = time.perf_counter()
                clock["stats0"] = strategy.stats() if sc else None
            elif b > 0 and (b % every == 0 or b == steps):
                clock["wall"] += time.perf_counter() - clock["t"]
                if variant != "compute_only":
                    evaluate(b)
                clock["t"] = time.perf_counter()

    callbacks: List[Any] = [_Clock()]
    extra: Dict[str, Any] = {}
    if variant == "adacomm":
        from tf_commopt.distribute.auto_interval import AdaCommCallback

        ada = AdaCommCallback(strategy, initial_interval=FLAGS.interval, max_interval=64)
        callbacks.insert(0, ada)
    if variant == "grid":
        from tf_commopt.distribute.auto_interval import keras_grid_search

        model.fit(train, epochs=1, steps_per_epoch=FLAGS.untimed_steps, verbose=0)  # trace first
        h, policy = keras_grid_search(
            model,
            strategy,
            train,  # every trial spans >= 2 syncs
            steps_per_trial=lambda c: max(FLAGS.grid_steps, 2 * c),
        )
        extra = {"interval_overhead_s": round(policy.overhead_s, 3), "grid_chosen": h}
        clock["wall"] += policy.overhead_s  # the trials are time before training proper
    if variant != "compute_only":
        evaluate(0)
    model.fit(train, epochs=1, steps_per_epoch=FLAGS.untimed_steps + steps, verbose=0, callbacks=callbacks)
    rec: Dict[str, Any] = {
        "variant": variant,
        "model": FLAGS.model,
        "split": FLAGS.split,
        "steps": steps,
        "param_bytes": param_bytes(model),
        "workers": strategy.num_replicas_in_sync,
        "wall_s": round(clock["wall"], 3),
        "ms_per_step": round(1000 * clock["wall"] / steps, 1),
        "curve": curve,
        **extra,
    }
    if curve:
        rec.update(test_accuracy=curve[-1]["test_accuracy"], test_loss=curve[-1]["test_loss"])
    if sc:
        st, st0 = strategy.stats(), clock["stats0"]
        rec.update(
            interval=st["interval"],
            syncs=st["syncs"] - st0["syncs"] - clock.get("eval_syncs", 0),
            comm_s=round(st["comm_s"] - st0["comm_s"] - clock.get("eval_comm", 0.0), 3),
            compute_s=round(st["compute_s"] - st0["compute_s"], 3),
        )
        for k in (
            "interval_t_comm_s",
            "interval_t_comp_s",
            "interval_overhead_s",
            "interval_selection_comm_s",
        ):
            if k in st:
                rec[k] = round(st[k], 5)
    if variant == "adacomm":
        rec.update(
            interval_overhead_s=round(ada.policy.overhead_s, 4), adacomm_history=ada.policy.history[:40]
        )
    if strategy.extended.should_checkpoint:
        print(json.dumps(rec), flush=True)


# ---------------------------------------------------------------------------------------------- parent
def _parse_settings() -> List[Dict[str, Any]]:
    from tf_commopt.errors import InputError

    out = []
    for entry in FLAGS.settings:
        head, _, vs = entry.partition("=")
        parts = head.split(":")
        if len(parts) != 3 or parts[2] not in ("iid", "non_iid"):
            raise InputError(f"expected model:mbit:iid|non_iid[=variants], got {entry!r}", where="--settings")
        try:
            mbit = float(parts[1])
        except ValueError:
            raise InputError(f"bad Mbit/s in {entry!r}", where="--settings") from None
        variants = FLAGS.variants or (vs.split(",") if vs else list(VARIANTS))
        bad = [v for v in variants if v not in VARIANTS]
        if bad:
            raise InputError(
                f"unknown variant(s) {bad}; choose from {', '.join(VARIANTS)}",
                where="--variants" if FLAGS.variants else "--settings",
            )
        out.append({"model": parts[0], "mbit": mbit, "split": parts[2], "variants": variants})
    return out


def parent() -> None:
    from tf_commopt.cluster import run_cluster
    from tf_commopt.errors import InputError

    try:
        settings = _parse_settings()
    except InputError as e:
        print(f"comm_bench: error: {e}", file=sys.stderr)
        sys.exit(2)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    jsonl = os.path.splitext(FLAGS.out)[0] + ".jsonl" if FLAGS.out else ""
    if jsonl and os.path.exists(jsonl) and not FLAGS.append:
        os.remove(jsonl)
    rows: List[Dict[str, Any]] = []
    failed: List[str] = []
    t_start = time.time()
    for s in settings:
        for v in s["variants"]:
            cmd = [
                sys.executable,
                "-m",
                "experiments.comm_bench",
                "--worker",
                f"--variant={v}",
                f"--model={s['model']}",
                f"--split={s['split']}",
                f"--steps={FLAGS.steps}",
                f"--untimed_steps={FLAGS.untimed_steps}",
                f"--eval_every={FLAGS.eval_every}",
                f"--interval={FLAGS.interval}",
                f"--grid_steps={FLAGS.grid_steps}",
                f"--batch_size={FLAGS.batch_size}",
                f"--learning_rate={FLAGS.learning_rate}",
                f"--momentum={FLAGS.momentum}",
                f"--non_iid_classes={FLAGS.non_iid_classes}",
                f"--seed={FLAGS.seed}",
            ]
            r = run_cluster(
                cmd,
                workers=FLAGS.workers,
                bandwidth_mbit=s["mbit"],
                topology=FLAGS.topology,
                timeout=400,
                cwd=root,
                echo=False,
            )
            lines = [json.loads(x) for x in r.outputs.get("worker:0", []) if x.startswith("{")]
            if r.returncode != 0 or not lines:
                print(
                    f"{s} {v}: failed ({r.message}); {r.last_lines('worker:0', 5)}",
                    file=sys.stderr,
                    flush=True,
                )
                failed.append(f"{s['model']}:{s['mbit']:g}:{s['split']} {v}")
                continue
            row = dict(
                lines[-1], mbit=s["mbit"], launch_wall_s=round(r.wall_s, 1) if hasattr(r, "wall_s") else None
            )
            rows.append(row)
            print(
                json.dumps({k: x for k, x in row.items() if k != "curve"}),
                f"[{time.time() - t_start:.0f} s]",
                flush=True,
            )
            if jsonl:
                with open(jsonl, "a", encoding="utf-8") as f:
                    f.write(json.dumps(row) + "\n")
    print(f"done in {time.time() - t_start:.0f} s")
    if FLAGS.out:
        from experiments.comm_report import write_report

        write_report(
            FLAGS.out, {"cnn": FLAGS.target_cnn, "big_mlp": FLAGS.target_big_mlp}, " ".join(sys.argv[1:])
        )
    if failed:  # never a silent success: the page then lacks these rows
        sys.stderr.write(
            f"comm_bench: error: {len(failed)} run(s) failed and are missing from the results: "
            f"{', '.join(failed)}\n"
        )
        sys.exit(1)


def main(argv: List[str]) -> None:
    del argv
    if FLAGS.report_only:
        from experiments.comm_report import write_report

        jsonl = os.path.splitext(FLAGS.out)[0] + ".jsonl"
        if not FLAGS.out or not os.path.exists(jsonl):
            print(
                f"comm_bench: error: --report_only needs --out=PAGE.md with PAGE.jsonl next to it ({jsonl!r} "
                "not found)",
                file=sys.stderr,
            )
            sys.exit(2)

        write_report(
            FLAGS.out, {"cnn": FLAGS.target_cnn, "big_mlp": FLAGS.target_big_mlp}, " ".join(sys.argv[1:])
        )
        return
    worker() if FLAGS.worker else parent()


if __name__ == "__main__":
    from experiments import _cli

    _cli.run(main)
