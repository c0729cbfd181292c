"""Overlapped syncs (issue 18) on the shaped cluster: wall time against the perfect-overlap bound and
accuracy against the blocking version.

For every ``--settings`` entry (``model:split``, split ``iid`` or ``non_iid`` = label-skewed shards, each
worker mostly holding ``--non_iid_classes`` labels) three runs of the runner (``experiments.train``,
``--strategy=skip_correct``, momentum 0 so the correction is vrl and a sync moves the model once) on a
``--workers`` cluster with ``--bandwidth_mbit`` per link (``--topology``), repeated ``--repeats`` times
with the variants interleaved:

* ``blocking``: H = ``--interval``, each sync stops every worker;
* ``overlap``: the same with ``--overlap`` (the all-reduce runs behind the next H local steps);
* ``compute_only``: H larger than the run: the same steps with no communication at all.

Wall = ``model.fit`` only (the runner's ``wall_s``; with overlap it includes applying the last
in-flight average). A second view, ``train_wall_s``, ends when training ends (tf-keras ``on_train_end``,
plus with overlap the wait for the last mean): it leaves out tf-keras's return path from ``fit``, which
tears down its data handler; that took from nothing to tens of seconds at random (tf.data's autotune thread missing
its cancellation, a TensorFlow 2.21 race) until the runner built its input pipelines without autotuning. communication-only = blocking − compute-only; the perfect-overlap bound is
max(compute-only, communication-only). One record per setting (medians over the repeats, and every
run) is appended to ``--out``; ``--page`` renders the results page from it
(``experiments/overlap_report.py``).

Example:
    python -m experiments.overlap_bench --settings=mlp:iid --repeats=1
    python -m experiments.overlap_bench --out=docs/results/overlap.jsonl --page=docs/results/overlap.md
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any, Dict, List

from absl import flags

from experiments._bench import runner_result
from experiments._cli import fail, run

VARIANTS = ("blocking", "overlap", "compute_only")
SPLITS = ("iid", "non_iid")

FLAGS = flags.FLAGS
flags.DEFINE_list(
    "settings", ["mlp:iid", "mlp:non_iid", "cnn:iid"], "model:split entries (split iid|non_iid)"
)
flags.DEFINE_integer("workers", 2, "worker processes")
flags.DEFINE_float("bandwidth_mbit", 10.0, "link rate (Mbit/s) of the shaped cluster")
flags.DEFINE_string(
    "topology", "switch", "tf_commopt.cluster topology: switch (a shaped link per worker) or shared"
)
flags.DEFINE_integer("interval", 16, "H of the blocking and overlapped runs")
flags.DEFINE_integer("steps", 300, "training steps per run")
flags.DEFINE_integer("repeats", 3, "repetitions (variants interleaved; medians reported)")
flags.DEFINE_integer("non_iid_classes", 5, "non_iid settings: labels each worker mostly holds")
flags.DEFINE_float("learning_rate", 0.05, "SGD learning rate (momentum 0)")
flags.DEFINE_string("out", "", "append the records to this .jsonl")
flags.DEFINE_string("page", "", "render this markdown page from --out's records")

NO_SYNC = 10**6  # compute-only: H beyond any run


def _variant_args(variant: str) -> List[str]:
    if variant == "compute_only":
        return [f"--interval={NO_SYNC}"]
    return [f"--interval={FLAGS.interval}"] + (["--overlap"] if variant == "overlap" else [])


def train_wall(run: Dict[str, Any]) -> float:
    """fit start → training ended (``on_train_end``) plus, with overlap, the wait for the mean still in flight
    then: ``wall_s`` without tf-keras's return path from ``fit`` (its data handler's teardown, which took from nothing
    to tens of seconds at random before the runner turned tf.data autotuning off)."""
    return run["train_end_s"] + run.get("drain_wait_s", 0.0)


def summarize(runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
    """Medians per variant, the bound and the ratios the page reports (pure: the results test uses it)."""
    med = {
        v: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "test_accuracy")}
        for v, rs in runs.items()
    }
    for v, rs in runs.items():
        med[v]["train_wall_s"] = statistics.median(train_wall(r) for r in rs)
    compute, blocking, overlap = (med[v]["wall_s"] for v in ("compute_only", "blocking", "overlap"))
    comm = blocking - compute
    bound = max(compute, comm)
    return {
        "median": med,
        "communication_only_s": round(comm, 3),
        "bound_s": round(bound, 3),
        "overlap_vs_blocking": round(overlap / blocking, 3),
        "overlap_vs_bound": round(overlap / bound, 3),
        "blocking_vs_bound": round(blocking / bound, 3),
        "accuracy_points_vs_blocking": round(
            100 * (med["overlap"]["test_accuracy"] - med["blocking"]["test_accuracy"]), 2
        ),
    }


def _record(rec: Dict[str, Any]) -> None:
    rec = dict(
        rec,
        when=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        command="python -m experiments.overlap_bench " + " ".join(sys.argv[1:]),
        load_average_1m=round(os.getloadavg()[0], 2),
        cores=os.cpu_count(),
    )
    print(json.dumps(rec), flush=True)
    if FLAGS.out:
        with open(FLAGS.out, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")


def bench_setting(setting: str) -> None:
    model, split = setting.split(":")
    base = [
        f"--model={model}",
        f"--steps={FLAGS.steps}",
        "--batch_size=128",
        "--momentum=0",
        f"--learning_rate={FLAGS.learning_rate}",
        "--strategy=skip_correct",
    ]
    if split == "non_iid":
        base.append(f"--non_iid_classes={FLAGS.non_iid_classes}")
    runs: Dict[str, List[Dict[str, Any]]] = {v: [] for v in VARIANTS}
    keep = (
        "wall_s",
        "first_step_s",
        "last_step_end_s",
        "train_end_s",
        "drain_wait_s",
        "test_accuracy",
        "interval",
        "syncs",
        "comm_s",
        "first_sync_s",
        "compute_s",
        "background_comm_s",
        "bytes_communicated",
    )
    for rep in range(FLAGS.repeats):
        for v in VARIANTS:
            r = runner_result(base + _variant_args(v), FLAGS.workers, FLAGS.bandwidth_mbit, FLAGS.topology)
            runs[v].append({k: r[k] for k in keep if k in r})
            print(
                f"  {setting} repeat {rep + 1}/{FLAGS.repeats} {v}: {r['wall_s']:.2f} s, accuracy "
                f"{r['test_accuracy']:.3f}",
                flush=True,
            )
    _record(
        {
            "setting": setting,
            "model": model,
            "split": split,
            "workers": FLAGS.workers,
            "bandwidth_mbit": FLAGS.bandwidth_mbit,
            "topology": FLAGS.topology,
            "interval": FLAGS.interval,
            "steps": FLAGS.steps,
            "repeats": FLAGS.repeats,
            "learning_rate": FLAGS.learning_rate,
            "non_iid_classes": FLAGS.non_iid_classes if split == "non_iid" else 0,
            "runs": runs,
            **summarize(runs),
        }
    )


def main(argv: List[str]) -> None:
    for s in FLAGS.settings:
        parts = s.split(":")
        if len(parts) != 2 or parts[1] not in SPLITS:
            fail(f"--settings: {s!r} is not model:split with split one of {', '.join(SPLITS)}")
        from experiments.models import MODELS

        if parts[0] not in MODELS:
            fail(f"--settings: unknown model {parts[0]!r}; choose one of {', '.join(MODELS)}")
    for name in ("workers", "interval", "steps", "repeats", "non_iid_classes"):
        if getattr(FLAGS, name) < 1:
            fail(f"--{name}: must be >= 1, got {getattr(FLAGS, name)}")
    if not FLAGS.bandwidth_mbit > 0:
        fail(f"--bandwidth_mbit: must be > 0, got {FLAGS.bandwidth_mbit}")
    if FLAGS.page and not FLAGS.out:
        fail("--page: needs --out (the records it is rendered from)")
    for s in FLAGS.settings:
        bench_setting(s)
    if FLAGS.page:
        from experiments.overlap_report import write_page

        write_page(FLAGS.out, FLAGS.page)


if __name__ == "__main__":
    run(main)
