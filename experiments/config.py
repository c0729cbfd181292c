"""What one run of the training runner is: the :class:`Config` dataclass, its validation and its flags.

Importing this module defines no flag: :func:`define_flags` puts the runner's flags on a given absl
``FlagValues`` (the one place they are defined) and :func:`config_from_flags` reads them back into a
validated Config.

Example:
    >>> cfg = validate(Config(strategy="skip_correct", interval="auto"))
    >>> cfg.interval, cfg.batch_size
    ('auto', 128)
    >>> from absl import flags
    >>> fv = flags.FlagValues()
    >>> define_flags(fv)
    >>> _ = fv(["train", "--strategy=single", "--steps=5"])
    >>> config_from_flags(fv).steps
    5
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Dict, Union

from experiments.data import parse_batch_shares
from experiments.models import MODELS
from experiments.optimizers import OPTIMIZERS, validate_optimizer
from experiments.slow import parse_slow_workers
from tf_commopt.core.compress import BLOCK_CODECS, CODECS
from tf_commopt.core.interval import validate_interval, validate_target_ratio
from tf_commopt.datasets import DATASETS
from tf_commopt.distribute.correction import CORRECTIONS, validate_correction_lr
from tf_commopt.errors import InputError

__all__ = ["STRATEGIES", "Config", "validate", "define_flags", "config_from_flags"]

STRATEGIES = ("single", "ssgd", "skip_correct", "local_sgd", "tf_ps_async")
SYNC_STRATEGIES = ("skip_correct", "local_sgd")  # the strategies with local steps and syncs


@dataclass
class Config:
    """Everything one run needs; ``Config()`` is the README's main job."""

    strategy: str = "ssgd"
    model: str = "cnn"
    dataset: str = "mnist"
    batch_size: int = 128
    epochs: int = 10
    steps: int = 0
    steps_per_epoch: int = 0
    replicas: int = 4
    seed: int = 0
    model_dir: str = ""
    learning_rate: float = 0.05
    momentum: float = 0.9
    optimizer: str = "sgd"
    interval: Union[int, str] = 4
    period: str = "steps"
    tau_eff: str = "mean"
    correction: str = "auto"
    warmup_steps: int = 0
    correction_lr: str = "effective"
    average_optimizer_state: bool = False
    target_ratio: float = 1.0
    max_interval: int = 256
    auto_probe_interval: int = 16
    bench_allreduce_mb: float = 0.0
    bench_repeats: int = 3
    backup_dir: str = ""
    backup_every: int = 0
    steps_per_execution: int = 1
    overlap: bool = False
    compression: str = ""
    host_interval: Union[int, str] = 0
    non_iid_classes: int = 0
    batch_shares: str = ""
    step_times: bool = False
    proc_stats: bool = False
    eval_every: int = 0
    eval_every_s: float = 0.0
    target_accuracy: float = 0.0
    slow_workers: str = ""
    interval_search: str = ""


HELP: Dict[str, str] = {
    "strategy": f"one of {', '.join(STRATEGIES)} (tf_ps_async: TensorFlow's own ParameterServerStrategy, "
    "ps clusters only)",
    "model": f"one of {', '.join(MODELS)}",
    "dataset": "mnist (bundled 5,000 images), cifar10 or mnist_full (download)",
    "batch_size": "global batch size (split evenly over the replicas)",
    "epochs": "passes over the training set (one pass when --steps > 0)",
    "steps": "train exactly this many global steps (0 = use --epochs)",
    "steps_per_epoch": "steps of each of --epochs epochs (0 = the training set's rows // --batch_size)",
    "replicas": "local replicas (logical CPU devices) when there is no TF_CONFIG",
    "seed": "random seed (weights, data order, train/test split)",
    "model_dir": "write weights and result.json here (chief only); empty = nowhere",
    "learning_rate": "the optimizer's learning rate",
    "momentum": "SGD momentum",
    "optimizer": f"{', '.join(OPTIMIZERS)} (tf-keras defaults, --learning_rate; --momentum is SGD's)",
    "interval": "skip_correct/local_sgd: steps between averagings, or 'auto'",
    "period": "skip_correct/local_sgd: steps (every worker takes --interval local steps per period) or time "
    "(every worker steps for the time the fastest needs for --interval steps, so a slower worker takes "
    "fewer; the sync averages normalised updates)",
    "tau_eff": "--period=time: how far a sync moves along the normalised average: mean (FedNova's mean "
    "local step count) or max (the fastest worker's, --interval)",
    "correction": "skip_correct: auto (vrl for plain SGD, gradient otherwise), gradient, vrl or none "
    "(local_sgd forces none)",
    "warmup_steps": "skip_correct/local_sgd: synchronous steps before skipping",
    "correction_lr": "skip_correct: the lr in the vrl update: effective (lr/(1-momentum)) or optimizer",
    "target_ratio": "--interval=auto: aimed communication/computation time ratio",
    "max_interval": "--interval=auto: cap on the chosen H",
    "auto_probe_interval": "--interval=auto: H while measuring (after 2 warm-up steps, 3 timed syncs)",
    "bench_allreduce_mb": "after training, time an all-reduce of this many MB (0 = off)",
    "bench_repeats": "timed repetitions of the all-reduce benchmark",
    "backup_dir": "resume: every task backs up here at each epoch end (and every --backup_every steps) and "
    "a restarted run continues from the last step every task backed up; a SIGTERM makes every task back "
    "up at the same step and exit with 143. Under tf_commopt.cluster --max-restarts the default is a "
    "temporary directory the launcher makes",
    "backup_every": "with a backup directory: also back up every this many global steps (0 = only at epoch "
    "ends); a failure then costs at most this many steps plus the restart",
    "steps_per_execution": "training steps per call of the traced train function (tf-keras "
    "compile(steps_per_execution=...))",
    "average_optimizer_state": "skip_correct/local_sgd: also average the optimizer slots (momentum, Adam "
    "moments) at each sync (their bytes travel too)",
    "overlap": "skip_correct/local_sgd: run each sync's all-reduce in the background while the replicas "
    "keep stepping; the stale average is applied at the next sync",
    "compression": "skip_correct/local_sgd: bf16 or fp16: each sync sends the model delta in that dtype with "
    "error feedback (half the bytes); int8 (with --host_interval): the hosts exchange it as int8 blocks with "
    "a float32 scale each (about a quarter); empty = float32",
    "host_interval": "skip_correct/local_sgd: two-level averaging: the replicas of one host (tasks "
    "sharing a host in tf_commopt.cluster --hosts/--tasks-per-host, or a TF_CONFIG host name) average "
    "every this many local steps, all every --interval (a multiple of it); 'auto' (with --interval=auto): "
    "both chosen from the probe's timings of host syncs, global syncs and steps; 0 = one level",
    "batch_shares": "skip_correct/local_sgd on a cluster: one share per worker (e.g. 1,0.5,1,0.5): worker i "
    "batches the per-worker batch times its share over the largest, so a slower worker reads fewer "
    "examples per step and no worker waits at a sync ('' = equal batches)",
    "non_iid_classes": "0: iid shards; k > 0: label-skewed shards, each worker's (local replicas: each "
    "replica's) mostly holding k labels",
    "step_times": "add step_ms, step_ms_p90 (per-step wall time after step 10) and startup_s "
    "(strategy construction to the end of the first step) to the record; every worker, not only the "
    "chief, prints its record as its last line",
    "proc_stats": "print 'PROC {...}' after each epoch: the task's resident memory, threads, open files",
    "eval_every": "evaluate the (averaged) model every this many steps, the clock paused; the record gets "
    "its curve (0 = only at the end)",
    "eval_every_s": "evaluate the (averaged) model whenever this many training seconds passed since the last "
    "evaluation, the clock paused (0 = not by time)",
    "target_accuracy": "record time_to_target_s and steps_to_target: the training seconds and steps at the "
    "first evaluation reaching this test accuracy (0 = off; needs --eval_every or --eval_every_s)",
    "slow_workers": "emulate slower workers: WORKER:FACTOR,... (e.g. 1:2.0,3:1.5: worker 1 computes 2x slower, "
    "worker 3 1.5x; workers numbered from 0 in TF_CONFIG's order, one process is worker 0)",
    "interval_search": "skip_correct: a baseline interval search instead of a fixed H: adacomm "
    "(AdaComm-style, from --interval) or grid (short trials of each H before training); empty = none",
}

_INTS = (
    ("batch_size", 1),
    ("epochs", 1),
    ("steps", 0),
    ("steps_per_epoch", 0),
    ("replicas", 1),
    ("warmup_steps", 0),
    ("bench_repeats", 1),
    ("max_interval", 1),
    ("auto_probe_interval", 1),
    ("steps_per_execution", 1),
    ("non_iid_classes", 0),
    ("eval_every", 0),
    ("backup_every", 0),
)


def _check_numbers(cfg: Config) -> None:
    for name, low in _INTS:
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise InputError(f"must be an integer >= {low}, got {v!r}", where=f"--{name}")
    for name in ("learning_rate", "bench_allreduce_mb", "eval_every_s"):
        v = getattr(cfg, name)
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise InputError(f"must be a number >= 0, got {v!r}", where=f"--{name}")
    if not (math.isfinite(cfg.momentum) and 0 <= cfg.momentum < 1):
        raise InputError(f"must be in [0, 1), got {cfg.momentum!r}", where="--momentum")
    for name in ("overlap", "average_optimizer_state", "step_times", "proc_stats"):
        if not isinstance(getattr(cfg, name), bool):
            raise InputError(f"must be true or false, got {getattr(cfg, name)!r}", where=f"--{name}")


def _check_evaluation(cfg: Config) -> None:
    t = cfg.target_accuracy
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not (0 <= t <= 1):
        raise InputError(f"must be a test accuracy in (0, 1] (0 = off), got {t!r}", where="--target_accuracy")
    if t and not (cfg.eval_every or cfg.eval_every_s):
        raise InputError(
            "needs evaluations to be reached at: give --eval_every or --eval_every_s",
            where="--target_accuracy",
        )


def _choice(value: Any, choices: Any, what: str, flag: str) -> None:
    if value not in choices:
        raise InputError(f"unknown {what} {value!r}; choose one of {', '.join(choices)}", where=flag)


def validate(cfg: Config) -> Config:
    """Check every field; InputError naming the flag otherwise. Returns cfg (interval parsed)."""
    _choice(cfg.strategy, STRATEGIES, "strategy", "--strategy")
    _choice(cfg.model, MODELS, "model", "--model")
    _choice(cfg.dataset, DATASETS, "dataset", "--dataset")
    _check_numbers(cfg)
    validate_optimizer(cfg.optimizer)
    cfg.interval = validate_interval(cfg.interval, where="--interval")
    validate_target_ratio(cfg.target_ratio, where="--target_ratio")
    validate_correction_lr(cfg.correction_lr, where="--correction_lr")
    for name in ("model_dir", "backup_dir"):
        d = getattr(cfg, name)
        if d and os.path.exists(d) and not os.path.isdir(d):
            raise InputError(f"{d!r} exists and is not a directory", where=f"--{name}")
    for name, does in (("overlap", "overlaps"), ("average_optimizer_state", "averages the slots at")):
        if getattr(cfg, name) and cfg.strategy not in SYNC_STRATEGIES:
            raise InputError(
                f"{does} the syncs of skip_correct/local_sgd; --strategy={cfg.strategy} has none",
                where=f"--{name}",
            )
    _choice(cfg.compression, ("",) + CODECS + BLOCK_CODECS, "compression", "--compression")
    if cfg.compression and cfg.strategy not in SYNC_STRATEGIES:
        raise InputError(
            f"compresses the syncs of skip_correct/local_sgd; not with --strategy={cfg.strategy}",
            where="--compression",
        )
    if cfg.non_iid_classes and cfg.backup_dir:
        raise InputError(
            "label-skewed shards are not resumable with --backup_dir yet (its per-epoch data order is iid)",
            where="--non_iid_classes",
        )
    if cfg.steps and cfg.steps_per_epoch:
        raise InputError("give --steps or --steps_per_epoch, not both", where="--steps_per_epoch")
    _check_evaluation(cfg)
    parse_slow_workers(cfg.slow_workers)
    if parse_batch_shares(cfg.batch_shares) and (cfg.strategy not in SYNC_STRATEGIES or cfg.backup_dir):
        raise InputError(
            "needs --strategy=skip_correct or local_sgd, without --backup_dir", where="--batch_shares"
        )
    _choice(cfg.correction, CORRECTIONS, "correction", "--correction")
    _choice(cfg.interval_search, ("", "adacomm", "grid"), "interval search", "--interval_search")
    if cfg.interval_search and (cfg.strategy != "skip_correct" or cfg.interval == "auto"):
        raise InputError("needs --strategy=skip_correct and an integer --interval", where="--interval_search")
    _check_period(cfg)
    _check_two_level(cfg)
    return cfg


def _host_interval(value: Any) -> Union[int, str]:
    """``--host_interval``: 0 (one level), an integer h >= 1 or ``"auto"``."""
    if value == "auto":
        return value
    try:
        h = int(value) if isinstance(value, str) else value
    except ValueError:
        h = None
    if isinstance(h, bool) or not isinstance(h, int) or h < 0:
        raise InputError(f"must be an integer >= 0 or 'auto', got {value!r}", where="--host_interval")
    return h


def _check_two_level(cfg: Config) -> None:
    cfg.host_interval = h = _host_interval(cfg.host_interval)
    if not h:
        if cfg.compression in BLOCK_CODECS:
            raise InputError(
                f"{cfg.compression} needs two-level averaging: give --host_interval", where="--compression"
            )
        return
    auto = h == "auto"
    for bad, why in (
        (cfg.strategy not in SYNC_STRATEGIES, "--strategy=skip_correct or local_sgd"),
        (auto and cfg.interval != "auto", "--interval=auto with --host_interval=auto"),
        (auto and cfg.auto_probe_interval < 2, "--auto_probe_interval >= 2 with --host_interval=auto"),
        (not auto and cfg.interval == "auto", "an integer --interval (or --host_interval=auto)"),
        (not auto and cfg.interval != "auto" and int(cfg.interval) % h, "--interval a multiple of it"),
        (cfg.overlap or cfg.period != "steps", "no --overlap and --period=steps"),
    ):
        if bad:
            raise InputError(f"two-level averaging needs {why}", where="--host_interval")


def _check_period(cfg: Config) -> None:
    _choice(cfg.period, ("steps", "time"), "period", "--period")
    _choice(cfg.tau_eff, ("mean", "max"), "tau_eff", "--tau_eff")
    if cfg.period == "steps":
        if cfg.tau_eff != "mean":
            raise InputError("needs --period=time", where="--tau_eff")
        return
    if cfg.strategy not in SYNC_STRATEGIES:
        raise InputError(
            f"--strategy={cfg.strategy} has no local steps; needs skip_correct or local_sgd", where="--period"
        )
    for bad, why in (
        (cfg.interval == "auto", "an integer --interval"),
        (cfg.overlap, "no --overlap"),
        (bool(cfg.interval_search), "no --interval_search"),
    ):
        if bad:
            raise InputError(f"--period=time needs {why}", where="--period")


# ------------------------------------------------------------------------------------------------ flags
def define_flags(fv: Any) -> None:
    """Define the runner's flags (one per Config field, its default and :data:`HELP`) on ``fv``."""
    from absl import flags

    for f in dataclasses.fields(Config):
        default, helptext = f.default, HELP[f.name]
        if isinstance(default, bool):
            flags.DEFINE_bool(f.name, default, helptext, flag_values=fv)
        elif f.name in ("interval", "host_interval") or isinstance(default, str):
            flags.DEFINE_string(f.name, str(default), helptext, flag_values=fv)
        elif isinstance(default, int):
            flags.DEFINE_integer(f.name, default, helptext, flag_values=fv)
        else:
            flags.DEFINE_float(f.name, default, helptext, flag_values=fv)


def config_from_flags(fv: Any) -> Config:
    """A validated Config from the parsed flags ``fv`` (defined by :func:`define_flags`)."""
    return validate(Config(**{f.name: getattr(fv, f.name) for f in dataclasses.fields(Config)}))
