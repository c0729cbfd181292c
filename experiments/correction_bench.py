"""The correction with every optimizer on label-skewed shards: SSGD vs plain local SGD vs the default
correction, for SGD, momentum and Adam, at H = 16 and 64. Page: docs/results/correction.md.

A sweep of local runner launches (one process, ``--replicas`` logical CPU replicas: accuracy, not speed,
is measured here): each replica trains on its own label-skewed shard of the bundled MNIST (runner
``--non_iid_classes``, ``--classes_per_shard`` labels mostly). Settings are optimizer:seed; variants
``ssgd`` (MirroredStrategy), ``none:H`` (plain local SGD) and ``auto:H`` (the default correction: vrl for
plain SGD, the gradient-space control variate otherwise). Test accuracy of the averaged model after
``--steps`` steps on the held-out images.

Example:
    python -m experiments.correction_bench --optimizers=sgd --intervals=16 --seeds=0 --steps=20 --out=/tmp/c.jsonl
    python -m experiments.correction_bench --out=docs/results/correction.jsonl
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional, Tuple

from experiments import _cli
from experiments.harness import Launch, Sweep, run_sweep
from experiments.page import Page, Table, verdict

OPTIMIZERS = {  # name -> runner flags
    "sgd": ["--optimizer=sgd", "--learning_rate=0.05", "--momentum=0"],
    "momentum": ["--optimizer=sgd", "--learning_rate=0.01", "--momentum=0.9"],
    "adam": ["--optimizer=adam", "--learning_rate=0.001"],
}
LEARNING_RATES = {"sgd": 0.05, "momentum": 0.01, "adam": 0.001}
VARIANTS = ("ssgd", "none", "auto")
GOALS = {16: 1.0, 64: 3.0}  # points below SSGD allowed at H (H = 64: plain SGD only)


def define(fv: Any) -> None:
    from absl import flags

    d = dict(flag_values=fv)
    flags.DEFINE_list("optimizers", list(OPTIMIZERS), f"any of {', '.join(OPTIMIZERS)}", **d)
    flags.DEFINE_list("intervals", ["16", "64"], "H values", **d)
    flags.DEFINE_list("variants", list(VARIANTS), f"any of {', '.join(VARIANTS)}", **d)
    flags.DEFINE_integer("replicas", 4, "logical CPU replicas", **d)
    flags.DEFINE_integer("classes_per_shard", 2, "labels per shard (label skew)", **d)
    flags.DEFINE_integer("steps", 400, "training steps", **d)
    flags.DEFINE_integer("per_replica_batch", 32, "examples per replica per step", **d)
    flags.DEFINE_list("seeds", ["0", "1"], "seeds (weights, shard split, order)", **d)
    flags.DEFINE_string("model", "mlp", "experiments.models name", **d)
    flags.DEFINE_string("out", "", "append one record per optimizer and seed to this .jsonl", **d)


def sweep(fv: Any) -> Sweep:
    for name, allowed in (("optimizers", OPTIMIZERS), ("variants", VARIANTS)):
        bad = [v for v in getattr(fv, name) if v not in allowed]
        if bad:
            _cli.fail(f"--{name}: unknown {', '.join(bad)}; choose from {', '.join(allowed)}")
    try:
        intervals, seeds = [int(h) for h in fv.intervals], [int(s) for s in fv.seeds]
    except ValueError as e:
        _cli.fail(f"--intervals/--seeds must be integers ({e})")
    if any(h < 1 for h in intervals) or fv.replicas < 2 or fv.steps < 1 or fv.classes_per_shard < 1:
        _cli.fail("--intervals must be >= 1, --replicas >= 2, --steps >= 1, --classes_per_shard >= 1")
    variants = [
        v if v == "ssgd" else f"{v}:{h}" for v in fv.variants for h in ([1] if v == "ssgd" else intervals)
    ]

    def launch(setting: str, variant: str) -> Launch:
        opt, seed = setting.split(":")
        kind, _, h = variant.partition(":")
        argv = [f"--model={fv.model}", f"--replicas={fv.replicas}", f"--steps={fv.steps}", f"--seed={seed}"]
        argv += [
            f"--batch_size={fv.per_replica_batch * fv.replicas}",
            f"--non_iid_classes={fv.classes_per_shard}",
        ]
        argv += OPTIMIZERS[opt] + (["--strategy=ssgd"] if kind == "ssgd" else ["--strategy=skip_correct"])
        argv += [] if kind == "ssgd" else [f"--correction={kind}", f"--interval={h}"]
        return Launch(argv, workers=0)

    def describe(setting: str) -> Dict[str, Any]:
        opt, seed = setting.split(":")
        return dict(optimizer=opt, learning_rate=LEARNING_RATES[opt], seed=int(seed))

    extra = dict(replicas=fv.replicas, classes_per_shard=fv.classes_per_shard, steps=fv.steps)
    extra.update(per_replica_batch=fv.per_replica_batch, model=fv.model)
    settings = [f"{o}:{s}" for s in seeds for o in fv.optimizers]
    keep = ("test_accuracy", "wall_s", "syncs", "bytes_communicated", "interval")
    return Sweep("correction", settings, variants, 1, launch, keep, describe, extra=extra)


def _body(fv: Any) -> int:
    run_sweep(sweep(fv), fv.out, _cli.command(fv))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m experiments.correction_bench`` in process; returns the exit code."""
    return _cli.main("experiments.correction_bench", argv, define, _body)


# ------------------------------------------------------------------------------------------------ page
def runs(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per run (optimizer, variant, interval, seed, test_accuracy): sweep records and older runs."""
    out = []
    for r in records:
        if "runs" not in r:
            out.append(r)
            continue
        for v, rs in r["runs"].items():
            kind, _, h = v.partition(":")
            out += [
                dict(x, optimizer=r["optimizer"], seed=r["seed"], variant=kind, interval=int(h or 1))
                for x in rs
            ]
    return out


def table(records: List[Dict[str, Any]]) -> Dict[Tuple[str, str, int], float]:
    """(optimizer, variant, H) -> mean test accuracy in % over the seeds."""
    acc: Dict[Tuple[str, str, int], List[float]] = {}
    for r in runs(records):
        acc.setdefault((r["optimizer"], r["variant"], int(r["interval"])), []).append(
            100 * r["test_accuracy"]
        )
    return {key: statistics.mean(v) for key, v in acc.items()}


def rows(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    t = table(records)
    seeds = sorted({r["seed"] for r in runs(records)})
    out = []
    for o in [o for o in OPTIMIZERS if any(k[0] == o for k in t)]:
        ssgd = t.get((o, "ssgd", 1))
        for h in sorted({k[2] for k in t if k[1] != "ssgd"}):
            none, auto = t.get((o, "none", h)), t.get((o, "auto", h))
            goal = GOALS.get(h) if (h == 16 or o == "sgd") else None
            diff = None if auto is None or ssgd is None else auto - ssgd
            ok = None if goal is None or diff is None else diff >= -goal
            row = dict(optimizer=o, lr=LEARNING_RATES[o], seeds=seeds, h=h, ssgd=ssgd, none=none, auto=auto)
            below = "" if none is None or auto is None or auto >= none else " (**below** plain local SGD)"
            out.append(
                dict(row, diff=diff, goal="—" if goal is None else f"≥ −{goal:g}: {verdict(ok)}{below}")
            )
    return out


def setup(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    keys = ("replicas", "classes_per_shard", "model", "steps", "per_replica_batch")
    seen = {tuple(r.get(k) for k in keys) for r in records}
    return [dict(zip(keys, s)) for s in sorted(seen, key=str)]


PAGE = Page(
    "correction",
    "The correction with every optimizer (label-skewed shards)",
    "Local replicas (logical CPUs, one process), each trained on its own label-skewed shard of the bundled "
    "MNIST: synchronous SGD against plain local SGD (`none`) and the default correction (`auto`: vrl for "
    "plain SGD, the gradient-space control variate otherwise) at each H, for SGD, SGD with momentum and "
    "Adam. Test accuracy (%) of the averaged model on the held-out images, the mean over the seeds; the goal "
    "is the default correction's largest allowed loss against SSGD.",
    [
        Table(
            "Setting",
            setup,
            [
                ("replicas", "replicas", "d"),
                ("labels per shard", "classes_per_shard", "d"),
                ("model", "model", ""),
                ("steps", "steps", "d"),
                ("examples per replica and step", "per_replica_batch", "d"),
            ],
        ),
        Table(
            "Test accuracy (%)",
            rows,
            [
                ("optimizer", "optimizer", ""),
                ("lr", "lr", "g"),
                ("seeds", "seeds", "d"),
                ("H", "h", "d"),
                ("SSGD", "ssgd", ".1f"),
                ("none", "none", ".1f"),
                ("auto", "auto", ".1f"),
                ("auto − SSGD", "diff", "+.1f"),
                ("goal", "goal", ""),
            ],
        ),
    ],
)

if __name__ == "__main__":
    raise SystemExit(main())
