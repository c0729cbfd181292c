"""Skip-and-correct vs synchronous SGD on a (bandwidth-limited) local cluster: time per step and accuracy.
Pages: docs/results/skip_correct.md, skip_correct_momentum0.md, skip_correct_non_iid.md.

A sweep of runner launches on ``--workers`` processes (``--bandwidth_mbit`` per link, ``--topology``), one
per variant: ``ssgd`` (MultiWorkerMirroredStrategy), ``local_sgd`` (no correction), ``vrl`` (the vrl
correction with the optimizer's lr) and ``vrl_effective`` (vrl with lr/(1 − β)), at H = ``--interval``.
Each run trains ``--untimed_steps`` + ``--steps`` steps; ms/step is the wall time from the end of the
first step to the end of the last over the steps between (the first step traces and sets up).

Example:
    python -m experiments.skip_correct_bench --steps=10 --variants=ssgd,vrl --out=/tmp/sc.jsonl
    python -m experiments.skip_correct_bench --workers=2 --bandwidth_mbit=20 --steps=60 \\
        --out=docs/results/skip_correct.jsonl && python -m experiments.report skip_correct
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from experiments import _cli
from experiments.harness import Launch, Sweep, run_sweep
from experiments.page import Page, Table

VARIANTS = {
    "ssgd": ["--strategy=ssgd"],
    "local_sgd": ["--strategy=local_sgd"],
    "vrl": ["--strategy=skip_correct", "--correction=vrl", "--correction_lr=optimizer"],
    "vrl_effective": ["--strategy=skip_correct", "--correction=vrl", "--correction_lr=effective"],
}


def define(fv: Any) -> None:
    from absl import flags

    d = dict(flag_values=fv)
    flags.DEFINE_list("variants", list(VARIANTS), f"any of {', '.join(VARIANTS)}", **d)
    flags.DEFINE_integer("workers", 2, "worker processes", **d)
    flags.DEFINE_float("bandwidth_mbit", 20.0, "shape each link to this rate (0 = no shaping)", **d)
    flags.DEFINE_string("topology", "switch", "switch or shared (see tf_commopt.cluster)", **d)
    flags.DEFINE_integer("steps", 60, "timed steps", **d)
    flags.DEFINE_integer("untimed_steps", 4, "steps before timing (tracing, collective set-up)", **d)
    flags.DEFINE_integer("interval", 4, "H for the skip-and-correct variants", **d)
    flags.DEFINE_string("model", "cnn", "experiments.models model name", **d)
    flags.DEFINE_integer("batch_size", 128, "global batch", **d)
    flags.DEFINE_float("learning_rate", 0.05, "SGD learning rate", **d)
    flags.DEFINE_float("momentum", 0.9, "SGD momentum", **d)
    flags.DEFINE_integer("seed", 0, "seed", **d)
    flags.DEFINE_integer("non_iid_classes", 0, "0: iid shards; k > 0: each worker mostly sees k labels", **d)
    flags.DEFINE_float("target_accuracy", 0.0, "record the time to this test accuracy (0 = off)", **d)
    flags.DEFINE_float(
        "eval_every_s", 1.0, "with --target_accuracy: evaluate every this many training seconds", **d
    )
    flags.DEFINE_integer("repeats", 1, "repetitions (variants interleaved)", **d)
    flags.DEFINE_string("out", "", "append the record to this .jsonl", **d)


def run_row(rec: Dict[str, Any]) -> Dict[str, Any]:
    """A runner record -> the row this bench keeps (ms per step after the first step)."""
    steps = rec["steps"]
    timed = rec["last_step_end_s"] - rec["first_step_s"]
    row = {"ms_per_step": round(1000 * timed / max(1, steps - 1), 2), "steps": steps}
    row.update(test_accuracy=round(rec["test_accuracy"], 4), test_loss=round(rec["test_loss"], 4))
    for k in ("interval", "syncs", "comm_s", "bytes_communicated", "time_to_target_s", "steps_to_target"):
        if k in rec:
            row[k] = round(rec[k], 3) if k == "comm_s" else rec[k]
    return row


def sweep(fv: Any) -> Sweep:
    bad = [v for v in fv.variants if v not in VARIANTS]
    if bad:
        _cli.fail(f"--variants: unknown {', '.join(bad)}; choose from {', '.join(VARIANTS)}")
    for name in ("workers", "steps", "interval", "repeats"):
        if getattr(fv, name) < 1:
            _cli.fail(f"--{name}: must be >= 1, got {getattr(fv, name)}")

    def launch(setting: str, variant: str) -> Launch:
        argv = [
            f"--model={fv.model}",
            f"--steps={fv.untimed_steps + fv.steps}",
            f"--batch_size={fv.batch_size}",
        ]
        argv += [f"--learning_rate={fv.learning_rate}", f"--momentum={fv.momentum}", f"--seed={fv.seed}"]
        argv += [f"--interval={fv.interval}", f"--non_iid_classes={fv.non_iid_classes}", *VARIANTS[variant]]
        if fv.target_accuracy:
            argv += [f"--target_accuracy={fv.target_accuracy}", f"--eval_every_s={fv.eval_every_s}"]
        return Launch(argv, workers=fv.workers, mbit=fv.bandwidth_mbit or None, topology=fv.topology)

    setting = f"{fv.model}:{fv.workers}:{fv.topology}:{fv.bandwidth_mbit:g}"
    extra = {k: getattr(fv, k) for k in ("model", "workers", "bandwidth_mbit", "topology", "interval")}
    extra.update({k: getattr(fv, k) for k in ("steps", "batch_size", "learning_rate", "momentum", "seed")})
    extra["non_iid_classes"] = fv.non_iid_classes
    return Sweep("skip_correct", [setting], fv.variants, fv.repeats, launch, extra=extra, reduce=run_row)


def _body(fv: Any) -> int:
    run_sweep(sweep(fv), fv.out, _cli.command(fv))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m experiments.skip_correct_bench`` in process; returns the exit code."""
    return _cli.main("experiments.skip_correct_bench", argv, define, _body)


# ------------------------------------------------------------------------------------------------ page
def rows(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per variant run: sweep records (``runs``) and the older one-record-per-variant rows."""
    out = []
    for r in records:
        if "runs" not in r:
            out.append(
                dict(r, bytes_communicated=r.get("bytes_per_worker"), syncs=r.get("syncs", r["steps"]))
            )
            continue
        for v, runs in r["runs"].items():
            out += [dict(x, variant=v, syncs=x.get("syncs", x["steps"])) for x in runs]
    return out


def setup(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The setting of each sweep record (older records carry none: their page's command gives it)."""
    return [r for r in records if "runs" in r]


_OLD = "python -m experiments.skip_correct_bench --workers=2 --bandwidth_mbit=20 --steps=60"
_COMMANDS = {
    "skip_correct": f"{_OLD} --out=docs/results/skip_correct.jsonl",
    "skip_correct_momentum0": f"{_OLD} --momentum=0 --variants=ssgd,local_sgd,vrl "
    "--out=docs/results/skip_correct_momentum0.jsonl",
    "skip_correct_non_iid": f"{_OLD} --non_iid_classes=5 --out=docs/results/skip_correct_non_iid.jsonl",
}
_SETUP = [
    (k, k, "g")
    for k in ("workers", "bandwidth_mbit", "interval", "steps", "batch_size", "learning_rate", "momentum")
]


def _page(name: str, title: str) -> Page:
    return Page(
        name,
        title,
        "Synchronous SGD (MultiWorkerMirroredStrategy) against skip-and-correct without correction "
        "(`local_sgd`) and with the vrl correction at the optimizer's lr (`vrl`) and at the effective lr "
        "(`vrl_effective`), each one run of the runner on the shaped cluster: time per step after the "
        "first, test accuracy and loss of the averaged model, syncs, their time and the bytes each worker "
        "sent. Rows without a command in their record were made with the command below before records "
        "carried one, with a launcher whose token bucket let a small model's sync pass partly unshaped.",
        [
            Table(
                "Setting",
                setup,
                [("model", "model", ""), *_SETUP, ("labels per worker", "non_iid_classes", "d")],
            ),
            Table(
                "Runs",
                rows,
                [
                    ("variant", "variant", ""),
                    ("ms/step", "ms_per_step", "g"),
                    ("test acc", "test_accuracy", "g"),
                    ("test loss", "test_loss", "g"),
                    ("syncs", "syncs", "d"),
                    ("comm s", "comm_s", "g"),
                    ("bytes/worker", "bytes_communicated", "d"),
                    ("s to target", "time_to_target_s", "g"),
                    ("steps to target", "steps_to_target", "d"),
                ],
                optional=("time_to_target_s", "steps_to_target"),
            ),
        ],
        commands=lambda rs, name=name: sorted({r.get("command", _COMMANDS[name]) for r in rs}),
    )


PAGES = [
    _page("skip_correct", "Skip-and-correct vs SSGD"),
    _page("skip_correct_momentum0", "Skip-and-correct vs SSGD, plain SGD without momentum"),
    _page("skip_correct_non_iid", "Skip-and-correct vs SSGD, label-skewed shards"),
]

if __name__ == "__main__":
    raise SystemExit(main())
