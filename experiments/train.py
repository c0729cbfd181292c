"""The training runner: one model, one data set, one distribution strategy; ends with one JSON line.

``python -m experiments.train`` with no flags is the README's main job: the bundled 5,000 real MNIST
images, a small CNN, synchronous data parallelism (``ssgd``) over 4 local replicas (logical CPU
devices), the Keras progress bar, a short summary and one final JSON line.

Under ``TF_CONFIG`` (e.g. started by ``python -m tf_commopt.cluster``) every worker runs this same
command. Without ps tasks the collective trainer runs (:mod:`experiments.collective`: ``ssgd`` is then
MultiWorkerMirroredStrategy, one CPU replica per worker; only the chief prints the JSON line and writes
``--model_dir``); with ps tasks the parameter-server trainer (:mod:`experiments.ps_train`) or, for
``--strategy=tf_ps_async``, TensorFlow's own ParameterServerStrategy (:mod:`experiments.tf_ps`). The
flags are those of :mod:`experiments.config` (docs/runner.md).

Example:
    python -m experiments.train --strategy=single --model=mlp --steps=50
    python -m tf_commopt.cluster --workers 2 --bandwidth-mbit 100 -- \\
        python -m experiments.train --strategy=ssgd --model=mlp --steps=20 --bench_allreduce_mb=4

In process: ``experiments.train.main(["train", "--strategy=single", "--steps=5"])`` returns the exit
code (0, or 2 after one error line on stderr); ``run(Config(...))`` returns the :class:`RunResult`.
"""

from __future__ import annotations

import logging as pylogging
import os
import sys
from typing import Any, List, Optional, TextIO

from experiments import _cli
from experiments.allreduce import time_allreduce
from experiments.backup import restore_backup, resume_epoch
from experiments.collective import RunResult, configure_local_cpus, make_strategy, run_collective
from experiments.config import STRATEGIES, Config, config_from_flags, define_flags, validate
from experiments.data import train_dataset_fn
from tf_commopt.core.tfconfig import tf_config_from_env

__all__ = [
    "STRATEGIES",
    "Config",
    "RunResult",
    "validate",
    "run",
    "main",
    "make_strategy",
    "configure_local_cpus",
    "resume_epoch",
    "restore_backup",
    "time_allreduce",
    "train_dataset_fn",
]

_train_dataset_fn = train_dataset_fn  # the name tests and older scripts import
_EXIT_AT_ONCE: List[bool] = []  # TF 2.21's ps coordinator can hang at interpreter exit (tf_ps_async)


def run(cfg: Config, out: Optional[TextIO] = None) -> RunResult:
    """Train as ``cfg`` says and return the record (printed as the last line on the chief).

    Example:
        >>> r = run(Config(strategy="single", model="mlp", steps=5))   # doctest: +SKIP
        >>> sorted(r.record)[:3]                                       # doctest: +SKIP
        ['dataset', 'epochs', 'global_batch_size']
    """
    validate(cfg)
    tfc = tf_config_from_env()
    if tfc is None:  # a blank TF_CONFIG: TensorFlow's resolver would json.loads("") and fail
        os.environ.pop("TF_CONFIG", None)
    if tfc is not None and tfc.num_ps:  # workers and ps tasks serve; the chief trains
        if cfg.strategy == "tf_ps_async":
            from experiments.tf_ps import run_tf_ps

            _EXIT_AT_ONCE.append(True)
            return RunResult(*run_tf_ps(cfg, out))
        from experiments.models import build_model
        from experiments.ps_train import run_training

        return RunResult(*run_training(cfg, build_model, out))
    return run_collective(cfg, tfc, out or sys.stdout)


def _body(fv: Any) -> int:
    from absl import logging

    from experiments.resume import Preempted
    from tf_commopt.core.restart import PREEMPTED_EXIT_CODE

    logging.set_verbosity(logging.WARNING)  # TF's per-step INFO lines drown the progress bar
    pylogging.getLogger("tensorflow").setLevel(pylogging.WARNING)
    try:
        run(config_from_flags(fv))
    except Preempted as e:
        sys.stderr.write(f"experiments.train: {e}; exiting with {PREEMPTED_EXIT_CODE} to be restarted\n")
        sys.stderr.flush()
        return PREEMPTED_EXIT_CODE
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m experiments.train`` in process: parse ``argv`` (``argv[0]`` is the program name), train,
    return the exit code."""
    return _cli.main("experiments.train", argv, define_flags, _body)


if __name__ == "__main__":
    code = main()
    if _EXIT_AT_ONCE:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
