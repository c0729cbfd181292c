"""Skip-and-correct speed against the floor and the strongest baselines (issue 12).

Four parts, each printed as a table and appended to ``--out`` (a .jsonl; ``--page`` rewrites the
markdown page from it):

* ``step`` — cost of a non-sync step and of start-up. ``--workers`` processes of each variant run at
  once (so the cores are shared exactly as in training), repeated ``--repeats`` times, variants
  interleaved: ``floor`` (a plain single-process tf-keras ``model.fit``, no strategy, same model,
  per-replica batch and threads: the cost of the step itself), ``mirrored`` (a single-process
  ``MirroredStrategy`` over one CPU: what any tf.distribute strategy's ``fit`` step costs on top of
  the floor, with no communication), ``mwms`` (MultiWorkerMirroredStrategy:
  the start-up reference), ``sc_local`` (SkipCorrectStrategy, H larger than the run: no sync at all)
  and ``sc_h16``. Step cost: the median over steps 11.. of the per-step wall time seen by a Keras
  callback; start-up: seconds from the strategy's construction to the end of the first step.
* ``sync`` — the steady wall time of one sync, ((comm_s − first_sync_s)/(syncs − 1) from ``stats()``),
  on the shaped network, against the ring all-reduce bound: a ring all-reduce of B bytes over N ranks
  moves 2(N−1)·B bytes in total; on the ``shared`` topology all of it crosses one segment of R bit/s
  (bound 2(N−1)·B·8/R), on ``switch`` every rank sends 2(N−1)/N·B over its own link (bound
  2(N−1)/N·B·8/R).
* ``auto`` — ``--auto_runs`` identical ``interval="auto"`` runs of the runner on the shaped network:
  the H each chose, the spread against their median.
* ``table`` — the runner (``experiments.train``) on the issue's testbed: SSGD, skip-and-correct H = 16
  (no correction), auto and H = 1000 (one sync), wall time (``fit`` only) and test accuracy.

Shaping is ``tf_commopt.cluster``'s (tc tbf; see docs/cluster.md for the burst and queue it uses).

Example:
    python -m experiments.sc_speed_bench --parts=step --workers=2 --repeats=3
    python -m experiments.sc_speed_bench --parts=sync,auto,table --out=docs/results/sc_speed.jsonl
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any, Dict, List

_T0 = time.perf_counter()

from absl import flags  # noqa: E402

from experiments._bench import cluster_results as _cluster  # noqa: E402
from experiments._bench import runner_result as _runner  # noqa: E402
from experiments._cli import fail, run  # noqa: E402

PARTS = ("step", "sync", "auto", "table")
STEP_VARIANTS = ("floor", "mirrored", "mwms", "sc_local", "sc_h16")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FLAGS = flags.FLAGS
flags.DEFINE_list("parts", list(PARTS), f"parts to run: {', '.join(PARTS)}")
flags.DEFINE_integer("workers", 2, "step part: worker processes")
flags.DEFINE_integer("repeats", 3, "step part: repetitions (variants interleaved)")
flags.DEFINE_string("model", "mlp", "step part: experiments.models name")
flags.DEFINE_integer("steps", 300, "step part: steps per run")
flags.DEFINE_integer("per_replica_batch", 32, "step part: examples per replica per step")
flags.DEFINE_integer(
    "steps_per_execution", 1, "step and table parts: tf-keras steps_per_execution of every variant"
)
flags.DEFINE_list(
    "sync_settings",
    ["mlp:4:shared:100:4", "big_mlp:4:shared:1000:4", "mlp:2:switch:10:4"],
    "sync part: model:workers:topology:mbit:H entries",
)
flags.DEFINE_integer("sync_syncs", 8, "sync part: syncs per run")
flags.DEFINE_integer("auto_runs", 5, "auto part: identical runs")
flags.DEFINE_string("auto_setting", "mlp:2:switch:10:300", "auto part: model:workers:topology:mbit:steps")
flags.DEFINE_integer(
    "auto_max_interval",
    100000,
    "auto part: the runner's --max_interval (high: the cap must not hide the rule's spread)",
)
flags.DEFINE_string("table_setting", "mlp:4:shared:100:300", "table part: model:workers:topology:mbit:steps")
flags.DEFINE_integer("table_repeats", 3, "table part: repetitions (variants interleaved; medians reported)")
flags.DEFINE_string("out", "", "append the records to this .jsonl")
flags.DEFINE_string(
    "page", "", "rewrite this markdown page from --out's records (no runs unless --parts given)"
)
flags.DEFINE_bool("worker", False, "internal: one process of the step/sync part")
flags.DEFINE_string("variant", "sc_local", "internal: worker variant")
flags.DEFINE_integer("interval", 16, "internal: worker H")


# ------------------------------------------------------------------------------------------------ worker
def worker() -> None:
    """One process: build the variant, fit ``--steps`` steps, print one JSON line."""
    import numpy as np

    variant = FLAGS.variant
    if variant in ("floor", "mirrored"):
        os.environ.pop("TF_CONFIG", None)
    import tensorflow as tf
    import tf_keras as k

    sys.path.insert(0, ROOT)
    from experiments.data import train_dataset_fn
    from experiments.models import build_model, param_bytes
    from tf_commopt.datasets import load_dataset

    t_import = time.perf_counter() - _T0
    t_strategy = time.perf_counter()
    if variant == "floor":
        strategy = tf.distribute.get_strategy()
    elif variant == "mirrored":  # tf.distribute's own per-step cost: one replica, no communication
        strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    elif variant == "mwms":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        from tf_commopt.distribute import SkipCorrectStrategy

        strategy = SkipCorrectStrategy(interval=FLAGS.interval, correction="none")
    data = load_dataset("mnist", seed=0)
    n = strategy.num_replicas_in_sync
    gb = FLAGS.per_replica_batch * n
    if variant == "floor":
        ds = train_dataset_fn(data.x_train, data.y_train, gb, 0)(tf.distribute.InputContext())
    else:
        ds = strategy.distribute_datasets_from_function(train_dataset_fn(data.x_train, data.y_train, gb, 0))
    with strategy.scope():
        model = build_model(FLAGS.model, data.input_shape, data.num_classes)
        model.compile(
            k.optimizers.SGD(0.05),
            k.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            steps_per_execution=FLAGS.steps_per_execution,
        )
    ends: List[float] = []

    class Clock(k.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            ends.append(time.perf_counter())

    model.fit(ds, epochs=1, steps_per_epoch=FLAGS.steps, verbose=0, callbacks=[Clock()])
    spe = FLAGS.steps_per_execution
    per_step = np.diff(ends) / spe
    skip = min(max(1, 10 // spe), max(0, len(per_step) - 1))  # short runs: keep at least one sample
    rec: Dict[str, Any] = {
        "variant": variant,
        "import_s": round(t_import, 3),
        "startup_s": round(ends[0] - t_strategy, 3),
        "step_ms": round(1000 * float(np.median(per_step[skip:])), 3),
        "step_ms_p90": round(1000 * float(np.percentile(per_step[skip:], 90)), 3),
        "param_bytes": param_bytes(model),
        "replicas": n,
    }
    if hasattr(strategy, "stats"):
        st = strategy.stats()
        rec.update(
            {key: st[key] for key in ("syncs", "comm_s", "first_sync_s", "bytes_communicated", "steps")}
        )
    print("RESULT " + json.dumps(rec), flush=True)


# ------------------------------------------------------------------------------------------------ driver
def _me(*extra: str) -> List[str]:
    return [sys.executable, "-m", "experiments.sc_speed_bench", "--worker", *extra]


def _parse(setting: str, n: int, flag: str) -> List[str]:
    parts = setting.split(":")
    if len(parts) != n:
        fail(f"--{flag}: {setting!r} is not {n} colon-separated fields")
    return parts


def _record(rec: Dict[str, Any]) -> None:
    rec = dict(
        rec,
        when=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        command="python -m experiments.sc_speed_bench " + " ".join(sys.argv[1:]),
        load_average_1m=round(os.getloadavg()[0], 2),
        cores=os.cpu_count(),
    )
    print(json.dumps(rec), flush=True)
    if FLAGS.out:
        with open(FLAGS.out, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")


def part_step() -> None:
    runs: Dict[str, List[Dict[str, Any]]] = {v: [] for v in STEP_VARIANTS}
    for rep in range(FLAGS.repeats):
        for v in STEP_VARIANTS:
            h = 16 if v == "sc_h16" else 10**9
            res = _cluster(
                _me(
                    f"--variant={v}",
                    f"--interval={h}",
                    f"--model={FLAGS.model}",
                    f"--steps={FLAGS.steps}",
                    f"--per_replica_batch={FLAGS.per_replica_batch}",
                    f"--steps_per_execution={FLAGS.steps_per_execution}",
                ),
                FLAGS.workers,
            )
            step = statistics.median(r["step_ms"] for r in res)
            start = statistics.median(r["startup_s"] for r in res)
            runs[v].append({"step_ms": step, "startup_s": start})
            print(
                f"  repeat {rep + 1}/{FLAGS.repeats} {v}: step {step:.3f} ms, start-up {start:.2f} s",
                flush=True,
            )
    med = {
        v: {key: statistics.median(r[key] for r in runs[v]) for key in ("step_ms", "startup_s")} for v in runs
    }
    _record(
        {
            "part": "step",
            "workers": FLAGS.workers,
            "model": FLAGS.model,
            "steps": FLAGS.steps,
            "per_replica_batch": FLAGS.per_replica_batch,
            "steps_per_execution": FLAGS.steps_per_execution,
            "repeats": FLAGS.repeats,
            "runs": runs,
            "median": med,
            "step_ratio_sc_local_vs_floor": round(med["sc_local"]["step_ms"] / med["floor"]["step_ms"], 3),
            "step_ratio_sc_local_vs_mirrored": round(
                med["sc_local"]["step_ms"] / med["mirrored"]["step_ms"], 3
            ),
            "startup_ratio_sc_vs_mwms": round(med["sc_local"]["startup_s"] / med["mwms"]["startup_s"], 3),
        }
    )


def part_sync() -> None:
    for setting in FLAGS.sync_settings:
        model, workers, topology, mbit, h = _parse(setting, 5, "sync_settings")
        workers, mbit, h = int(workers), float(mbit), int(h)
        steps = h * (FLAGS.sync_syncs + 1)
        res = _cluster(
            _me(
                "--variant=sc_h16",
                f"--interval={h}",
                f"--model={model}",
                f"--steps={steps}",
                "--per_replica_batch=32",
            ),
            workers,
            mbit,
            topology,
        )
        b = res[0]["param_bytes"]
        per_sync = statistics.median((r["comm_s"] - r["first_sync_s"]) / (r["syncs"] - 1) for r in res)
        total = 2 * (workers - 1) * b * 8 / (mbit * 1e6)
        bound = total if topology == "shared" else total / workers
        _record(
            {
                "part": "sync",
                "model": model,
                "workers": workers,
                "topology": topology,
                "mbit": mbit,
                "interval": h,
                "param_bytes": b,
                "syncs": res[0]["syncs"],
                "sync_s": round(per_sync, 4),
                "bound_s": round(bound, 4),
                "ratio_to_bound": round(per_sync / bound, 3),
            }
        )


def part_auto() -> None:
    model, workers, topology, mbit, steps = _parse(FLAGS.auto_setting, 5, "auto_setting")
    hs, walls, timings = [], [], []
    for i in range(FLAGS.auto_runs):
        r = _runner(
            [
                f"--model={model}",
                f"--steps={steps}",
                "--strategy=skip_correct",
                "--interval=auto",
                "--momentum=0",
                f"--max_interval={FLAGS.auto_max_interval}",
            ],
            int(workers),
            float(mbit),
            topology,
        )
        hs.append(r["interval"])
        walls.append(r["wall_s"])
        timings.append(
            {
                k[len("interval_") :]: r.get(k)
                for k in (
                    "interval_t_comm_s",
                    "interval_t_comp_s",
                    "interval_t_comm_samples_s",
                    "interval_t_comp_samples_s",
                )
            }
        )
        print(
            f"  run {i + 1}: H = {r['interval']} (t_comm {r.get('interval_t_comm_s')}, "
            f"t_comp {r.get('interval_t_comp_s')}), {r['wall_s']} s",
            flush=True,
        )
    med = statistics.median(hs)
    _record(
        {
            "part": "auto",
            "setting": FLAGS.auto_setting,
            "intervals": hs,
            "walls_s": walls,
            "median_h": med,
            "max_dev_from_median": round(max(abs(h - med) / med for h in hs), 3),
            "max_interval": FLAGS.auto_max_interval,
            "probe_interval": _default_probe_interval(),
            "timings": timings,
        }
    )


def _default_probe_interval() -> int:
    """The probe H the runner's ``interval="auto"`` uses (SkipCorrectStrategy's default)."""
    import inspect

    from tf_commopt.distribute import SkipCorrectStrategy

    return int(inspect.signature(SkipCorrectStrategy).parameters["auto_probe_interval"].default)


def part_table() -> None:
    model, workers, topology, mbit, steps = _parse(FLAGS.table_setting, 5, "table_setting")
    base = [
        f"--model={model}",
        f"--steps={steps}",
        "--batch_size=128",
        "--momentum=0",
        f"--steps_per_execution={FLAGS.steps_per_execution}",
    ]
    variants = [
        ("ssgd", ["--strategy=ssgd"]),
        ("sc_h16_none", ["--strategy=skip_correct", "--interval=16", "--correction=none"]),
        ("sc_auto", ["--strategy=skip_correct", "--interval=auto"]),
        ("sc_h1000", ["--strategy=skip_correct", "--interval=1000"]),
    ]
    runs: Dict[str, List[Dict[str, Any]]] = {name: [] for name, _ in variants}
    for rep in range(FLAGS.table_repeats):
        for name, extra in variants:
            r = _runner(base + extra, int(workers), float(mbit), topology)
            runs[name].append(
                {
                    "wall_s": r["wall_s"],
                    "test_accuracy": r["test_accuracy"],
                    "interval": r.get("interval"),
                    "syncs": r.get("syncs"),
                    "comm_s": r.get("comm_s"),
                    "first_sync_s": r.get("first_sync_s"),
                }
            )
            print(
                f"  repeat {rep + 1}/{FLAGS.table_repeats} {name}: {r['wall_s']} s, accuracy "
                f"{r['test_accuracy']:.3f}, H {r.get('interval')}",
                flush=True,
            )
    rows = {
        name: {
            "wall_s": statistics.median(x["wall_s"] for x in rs),
            "test_accuracy": statistics.median(x["test_accuracy"] for x in rs),
            "interval": statistics.median(x["interval"] for x in rs) if rs[0]["interval"] else None,
            "syncs": statistics.median(x["syncs"] for x in rs) if rs[0]["syncs"] else None,
        }
        for name, rs in runs.items()
    }
    ssgd = rows["ssgd"]["wall_s"]
    _record(
        {
            "part": "table",
            "setting": FLAGS.table_setting,
            "repeats": FLAGS.table_repeats,
            "runs": runs,
            "steps_per_execution": FLAGS.steps_per_execution,
            "rows": rows,
            "wall_ratio_vs_ssgd": {k: round(v["wall_s"] / ssgd, 3) for k, v in rows.items()},
        }
    )


def main(argv: List[str]) -> None:
    if FLAGS.worker:
        worker()
        return
    bad = [p for p in FLAGS.parts if p not in PARTS]
    if bad:
        fail(f"--parts: unknown part(s) {', '.join(bad)}; choose from {', '.join(PARTS)}")
    for name in (
        "workers",
        "repeats",
        "steps",
        "per_replica_batch",
        "steps_per_execution",
        "sync_syncs",
        "auto_runs",
        "table_repeats",
    ):
        if getattr(FLAGS, name) < 1:
            fail(f"--{name}: must be >= 1, got {getattr(FLAGS, name)}")
    if FLAGS.page and not FLAGS["parts"].present:
        from experiments.sc_speed_report import write_page

        write_page(FLAGS.out, FLAGS.page)
        return
    for part in FLAGS.parts:
        print(f"== {part}", flush=True)
        {"step": part_step, "sync": part_sync, "auto": part_auto, "table": part_table}[part]()
    if FLAGS.page:
        from experiments.sc_speed_report import write_page

        write_page(FLAGS.out, FLAGS.page)


if __name__ == "__main__":
    run(main)
