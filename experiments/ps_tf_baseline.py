"""TensorFlow's own parameter-server training as a baseline: ``python -m experiments.ps_tf_baseline`` is
the runner with ``--strategy=tf_ps_async`` (:mod:`experiments.tf_ps`), its ``--steps`` split into
``--epochs`` epochs.

Example (every task runs it; worker and ps tasks serve, the chief trains and prints one JSON line)::

    python -m tf_commopt.cluster --workers 2 --ps 1 --chief --tolerate-worker-failures -- \\
        python -m experiments.ps_tf_baseline --steps=1600 --batch_size=32 --learning_rate=0.1
"""

from __future__ import annotations

from typing import Any, List, Optional

from experiments import _cli


def define(fv: Any) -> None:
    from absl import flags

    d = dict(flag_values=fv)
    flags.DEFINE_integer("steps", 1600, "training steps (closures) in all", **d)
    flags.DEFINE_integer(
        "epochs", 4, "the steps are split into this many epochs (an EPOCH line after each)", **d
    )
    flags.DEFINE_integer("batch_size", 32, "batch per step", **d)
    flags.DEFINE_float("learning_rate", 0.1, "SGD learning rate", **d)
    flags.DEFINE_string("model", "mlp", "a model of experiments.models", **d)
    flags.DEFINE_integer("seed", 0, "random seed", **d)


def runner_argv(fv: Any) -> List[str]:
    """The runner's flags for these."""
    for name in ("steps", "epochs", "batch_size"):
        if getattr(fv, name) < 1:
            _cli.fail(f"--{name}: must be >= 1, got {getattr(fv, name)}")
    if fv.steps % fv.epochs:
        _cli.fail(f"--steps: {fv.steps} steps do not split into {fv.epochs} epochs")
    return [
        "train",
        "--strategy=tf_ps_async",
        f"--model={fv.model}",
        f"--epochs={fv.epochs}",
        f"--steps_per_epoch={fv.steps // fv.epochs}",
        f"--batch_size={fv.batch_size}",
        f"--learning_rate={fv.learning_rate}",
        "--momentum=0",
        f"--seed={fv.seed}",
    ]


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m experiments.ps_tf_baseline`` in process; returns the exit code."""
    from experiments import train

    return _cli.main("experiments.ps_tf_baseline", argv, define, lambda fv: train.main(runner_argv(fv)))


if __name__ == "__main__":
    import os
    import sys

    code = main()
    sys.stdout.flush()
    os._exit(code)  # TF 2.21's coordinator can hang at exit after a worker failure
