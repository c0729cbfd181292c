"""Skip-and-correct on a parameter-server cluster with label-skewed shards: correction none vs vrl (or
gradient for the other optimizers), from the same initial weights.

A sweep of runner launches on a cluster of ``--workers`` workers, one ps and a chief: the ``mlp`` on the
bundled MNIST split over the workers by label (runner ``--non_iid_classes``), ``--rounds`` rounds of H =
``--interval`` local steps per correction. One record per optimizer to ``--out``, the test accuracy of
each correction's run.

Example:
    python -m experiments.ps_non_iid --interval=4 --rounds=5 --out=/tmp/ps_non_iid.jsonl
    python -m experiments.ps_non_iid --interval=16 --learning_rate=0.1 --rounds=25 --optimizer=adam
"""

from __future__ import annotations

from typing import Any, List, Optional

from experiments import _cli
from experiments.harness import Launch, Sweep, run_sweep


def define(fv: Any) -> None:
    from absl import flags

    d = dict(flag_values=fv)
    flags.DEFINE_integer("interval", 16, "local steps per round (H)", **d)
    flags.DEFINE_float("learning_rate", 0.1, "learning rate (SGD: no momentum)", **d)
    flags.DEFINE_string("optimizer", "sgd", "sgd, adam, rmsprop or adagrad", **d)
    flags.DEFINE_string(
        "corrections",
        "",
        "comma-separated corrections; default none,vrl for sgd, none,gradient otherwise",
        **d,
    )
    flags.DEFINE_integer("rounds", 25, "rounds per correction", **d)
    flags.DEFINE_integer("batch_size", 32, "batch per shard and step", **d)
    flags.DEFINE_integer("classes_per_shard", 5, "labels per shard (split_non_iid)", **d)
    flags.DEFINE_integer("workers", 2, "worker tasks", **d)
    flags.DEFINE_integer("seed", 0, "data split, order and initial weights", **d)
    flags.DEFINE_string("out", "", "append the record to this .jsonl", **d)


def sweep(fv: Any) -> Sweep:
    from experiments.optimizers import validate_optimizer
    from tf_commopt.distribute.correction import validate_correction

    opt = validate_optimizer(fv.optimizer)
    corrections = (
        fv.corrections.split(",") if fv.corrections else ["none", "vrl" if opt == "sgd" else "gradient"]
    )
    for c in corrections:
        validate_correction(c, where="--corrections")
    for name in ("interval", "rounds", "batch_size", "classes_per_shard"):
        if getattr(fv, name) < 1:
            _cli.fail(f"--{name}: must be >= 1, got {getattr(fv, name)}")

    def launch(setting: str, correction: str) -> Launch:
        argv = [
            "--model=mlp",
            "--strategy=skip_correct",
            f"--correction={correction}",
            f"--interval={fv.interval}",
        ]
        argv += [
            f"--optimizer={opt}",
            f"--learning_rate={fv.learning_rate}",
            "--momentum=0",
            f"--seed={fv.seed}",
        ]
        argv += [f"--batch_size={fv.batch_size * fv.workers}", f"--steps={fv.rounds * fv.interval}"]
        argv += [f"--non_iid_classes={fv.classes_per_shard}"]
        return Launch(argv, workers=fv.workers, ps=1, chief=True, timeout=900)

    extra = dict(optimizer=opt, interval=fv.interval, learning_rate=fv.learning_rate, rounds=fv.rounds)
    extra.update(workers=fv.workers, classes_per_shard=fv.classes_per_shard)
    keep = ("test_accuracy", "train_loss", "correction", "syncs", "comm_s", "bytes_communicated", "wall_s")
    return Sweep("ps_non_iid", [opt], corrections, 1, launch, keep, extra=extra)


def _body(fv: Any) -> int:
    run_sweep(sweep(fv), fv.out, _cli.command(fv))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m experiments.ps_non_iid`` in process; returns the exit code."""
    return _cli.main("experiments.ps_non_iid", argv, define, _body)


if __name__ == "__main__":
    raise SystemExit(main())
