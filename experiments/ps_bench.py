"""Parameter-server skip-and-correct vs collective skip-and-correct vs SSGD, and the cost of one worker
failure against TensorFlow's own ParameterServerStrategy. Pages: docs/results/ps.md, ps_auto_trace.md.

A sweep of runner launches, one per run name: 2 workers (+ 1 ps + a chief on the ps runs), each task on
its own ``--bandwidth_mbit`` link, the ``mlp`` on the bundled MNIST, plain SGD (lr 0.1, no momentum), the
same number of training examples in every run (``--steps`` global steps of batch 64 = 2 workers x 32;
TensorFlow's asynchronous run, ``--strategy=tf_ps_async``, takes 2 x steps closures of batch 32 in 5
epochs). The ``*_kill`` runs SIGKILL worker 1 once the chief has finished a fifth of the training and go on
with ``tolerate_worker_failures`` (no restart).

Example::

    python -m experiments.ps_bench --steps=40 --only=skip_correct_ps --out=/tmp/ps.jsonl
    python -m experiments.ps_bench --bandwidth_mbit=100 --steps=800 --out=docs/results/ps.jsonl
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from experiments import _cli
from experiments.harness import Launch, Sweep, run_sweep
from experiments.page import Page, Table

KEEP = (
    "strategy",
    "steps",
    "wall_s",
    "steps_per_s",
    "test_accuracy",
    "train_loss",
    "bytes_communicated",
    "median_round_s",
    "lost_workers",
    "interval",
    "cluster_wall_s",
    "killed_at_s",
    "worker_failures",
    "ok",
)
LABELS = {
    "ssgd_collective": "SSGD, collective (MultiWorkerMirrored)",
    "skip_correct_collective": "skip-and-correct, collective (`SkipCorrectStrategy`)",
    "ssgd_ps": "SSGD, parameter server (`ParameterServerSkipCorrect`, H = 1)",
    "skip_correct_ps": "skip-and-correct, parameter server",
    "skip_correct_ps_kill": "skip-and-correct, parameter server, worker 1 killed",
    "tf_ps_async": "TensorFlow `ParameterServerStrategy` + `model.fit` (async)",
    "tf_ps_async_kill": "TensorFlow `ParameterServerStrategy` + `model.fit`, worker 1 killed",
}
EPOCHS_TF = 5


def define(fv: Any) -> None:
    from absl import flags

    d = dict(flag_values=fv)
    flags.DEFINE_float("bandwidth_mbit", 100.0, "each task's link (Mbit/s); 0 = plain loopback", **d)
    flags.DEFINE_integer("steps", 800, "global steps (batch 64)", **d)
    flags.DEFINE_string("out", "", "append the record here", **d)
    flags.DEFINE_string("only", "", "comma-separated run names (default: all)", **d)


def launches(steps: int, mbit: float) -> Dict[str, Launch]:
    """Every run of the bench by name."""
    train = ["--model=mlp", "--momentum=0", "--learning_rate=0.1"]
    sync = train + ["--batch_size=64", f"--steps={steps}"]
    sc = sync + ["--strategy=skip_correct", "--interval=4", "--correction=vrl"]
    tfb = train + ["--strategy=tf_ps_async", "--batch_size=32", f"--epochs={EPOCHS_TF}"]
    tfb.append(f"--steps_per_epoch={max(1, 2 * steps // EPOCHS_TF)}")
    ps = dict(ps=1, chief=True, mbit=mbit or None, timeout=900)
    kill_round = f"round {steps // 20 + 1}/{steps // 4}"
    return {
        "ssgd_collective": Launch(sync + ["--strategy=ssgd"], mbit=mbit or None, timeout=900),
        "skip_correct_collective": Launch(sc, mbit=mbit or None, timeout=900),
        "ssgd_ps": Launch(sync + ["--strategy=ssgd"], **ps),
        "skip_correct_ps": Launch(sc, **ps),
        "skip_correct_ps_kill": Launch(sc, kill_worker_on=kill_round, **ps),
        "tf_ps_async": Launch(tfb, **ps),
        "tf_ps_async_kill": Launch(tfb, kill_worker_on="EPOCH 1 ", **ps),
    }


def _body(fv: Any) -> int:
    specs = launches(fv.steps, fv.bandwidth_mbit)
    names = fv.only.split(",") if fv.only else list(specs)
    bad = [n for n in names if n not in specs]
    if bad:
        _cli.fail(f"--only: unknown run(s) {', '.join(bad)}; choose from {', '.join(specs)}")
    if fv.steps < 20:
        _cli.fail(f"--steps: must be >= 20 (the kill runs act after a fifth), got {fv.steps}")
    setting = f"{fv.bandwidth_mbit:g}"
    extra = {"bandwidth_mbit": fv.bandwidth_mbit, "steps": fv.steps}
    sweep = Sweep("ps", [setting], names, 1, lambda s, v: specs[v], KEEP, extra=extra)
    run_sweep(sweep, fv.out, _cli.command(fv))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m experiments.ps_bench`` in process; returns the exit code."""
    return _cli.main("experiments.ps_bench", argv, define, _body)


# ------------------------------------------------------------------------------------------------ page
def rows(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per run: sweep records (``runs``) and the older one-record-per-run lines."""
    out = []
    for r in records:
        runs = r["runs"].items() if "runs" in r else [(r["run"], [r])]
        for name, rs in runs:
            for x in rs:
                row = dict(x, run=LABELS.get(name, name), mb=x.get("bytes_communicated"))
                row["mb"] = None if row["mb"] is None else row["mb"] / 1e6
                row["failures"] = ", ".join(x.get("worker_failures") or []) or None
                out.append(row)
    return out


def rows_failure(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per killed run: the same run without the failure, the wall time it cost and the accuracies."""
    runs: Dict[str, Dict[str, Any]] = {}
    for r in records:
        for name, rs in r["runs"].items() if "runs" in r else [(r["run"], [r])]:
            runs[name] = rs[-1]
    out = []
    for name, killed in runs.items():
        base = runs.get(name[: -len("_kill")]) if name.endswith("_kill") else None
        if base is None:
            continue
        cost = killed["wall_s"] - base["wall_s"]
        row = dict(
            run=LABELS.get(base.get("run", name[:-5]), name[:-5]),
            wall=base["wall_s"],
            killed=killed["wall_s"],
        )
        row.update(cost=cost, cost_pct=100 * cost / base["wall_s"], acc=base["test_accuracy"])
        out.append(dict(row, acc_killed=killed["test_accuracy"]))
    return out


PAGE = Page(
    "ps",
    "Parameter-server skip-and-correct vs collective, SSGD, and TensorFlow's ParameterServerStrategy",
    "Each run is one real local cluster: two workers (plus one ps and a chief on the parameter-server "
    "runs), each task's link shaped, the `mlp` on the bundled MNIST, plain SGD, the same number of training "
    "examples in every run (TensorFlow's asynchronous run takes twice the closures at half the batch). "
    "Wall = the runner's training time (after start-up, before evaluation); MB = what the workers moved "
    "to and from the ps, or through the all-reduce. The runs marked killed SIGKILL worker one after a fifth "
    "of the training and go on without it (`tolerate_worker_failures`, no restart): their wall against the "
    "same run without the failure is the cost of the failure.",
    [
        Table(
            "",
            rows,
            [
                ("run", "run", ""),
                ("strategy", "strategy", ""),
                ("steps", "steps", "d"),
                ("wall s", "wall_s", ".1f"),
                ("steps/s", "steps_per_s", ".1f"),
                ("test acc.", "test_accuracy", "%"),
                ("MB moved", "mb", ",.1f"),
                ("H", "interval", "g"),
                ("killed at s", "killed_at_s", ".1f"),
                ("failed tasks", "failures", ""),
                ("cluster wall s", "cluster_wall_s", ".1f"),
            ],
        ),
        Table(
            "The cost of one worker failure",
            rows_failure,
            [
                ("run", "run", ""),
                ("wall, no failure s", "wall", ".1f"),
                ("wall, worker killed s", "killed", ".1f"),
                ("cost s", "cost", "+.1f"),
                ("cost %", "cost_pct", "+.0f"),
                ("test acc., no failure", "acc", "%"),
                ("test acc., worker killed", "acc_killed", "%"),
            ],
        ),
    ],
)


def rows_trace(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return records


TRACE_PAGE = Page(
    "ps_auto_trace",
    'Parameter-server `interval="auto"`: re-tracing the closure for the chosen H',
    "Interleaved runs of the same command (`--interval=auto` on a parameter-server cluster), with the "
    "closure's local steps unrolled (the earlier code: tracing grows with H) and as one `tf.while_loop` "
    "(traced once whatever H is): the chosen H, the re-trace time (`interval_overhead_s`), wall time and "
    "test accuracy. The unrolled runs need the earlier code; the command reproduces the loop runs.",
    [
        Table(
            "",
            rows_trace,
            [
                ("run", "order", "d"),
                ("closure", "closure", ""),
                ("H", "interval", "d"),
                ("re-trace s", "interval_overhead_s", ".1f"),
                ("wall s", "wall_s", ".1f"),
                ("test acc.", "test_accuracy", "%"),
            ],
        )
    ],
)

if __name__ == "__main__":
    raise SystemExit(main())
