"""``experiments.train`` on a TF_CONFIG cluster with ``ps`` tasks: ssgd / skip_correct / local_sgd rounds.

The runner, not the library: it is typed on ``experiments.config.Config``, loads the data set, evaluates
and writes ``result.json``; the library part is ``tf_commopt.distribute.ps``.
``experiments.train`` hands over to :func:`run_training` when ``TF_CONFIG`` has ps tasks.

Example::

    python -m tf_commopt.cluster --workers 2 --ps 1 --chief -- \\
        python -m experiments.train --strategy=skip_correct --interval=4 --model=mlp --steps=40

Worker and ps tasks serve (``serve_unless_chief``) and exit when the chief is gone; the chief trains
with ``model.fit`` through ``tf_commopt.distribute.ps`` (a model compiled with ``--optimizer`` in a
ParameterServerSkipCorrect's scope): ``ssgd`` = interval 1 and no correction (exactly synchronous SGD
with momentum), ``local_sgd`` = correction none, ``skip_correct`` = ``--interval`` and ``--correction``;
exactly ``--steps`` (or ``--epochs`` x rows // batch) steps, each epoch's last round cut to the steps left.
One data shard per worker; ``--batch_size`` is the global batch (batch_size / workers per shard and
local step). The record (``experiments.record.build_record``, shared with the collective runner) has
its keys plus ``ps, interval, correction, syncs, comm_s, compute_s, bytes_communicated, first_round_s,
median_round_s, lost_workers`` (and ``resumed_after_round`` with ``--backup_dir``).

With ``--backup_dir`` the chief saves the ps state (global model, D_i, v_i, round) every tenth of the
run and at the end; the same command run again (e.g. after a ps task died) resumes after the last
saved round and, the batches being a function of (shard, step), reproduces the uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import Any, Callable, Dict, Optional, TextIO, Tuple

from experiments.config import Config
from experiments.record import build_record, save_result
from tf_commopt.core.tfconfig import tf_config_from_env
from tf_commopt.errors import InputError

__all__ = ["run_training", "PS_STRATEGIES", "rounds_left"]

PS_STRATEGIES = ("ssgd", "skip_correct", "local_sgd")


def rounds_left(steps_done: int, steps: int, interval: int, steps_per_epoch: int) -> int:
    """Rounds from ``steps_done`` to ``steps`` with H = ``interval``, each epoch's last round cut to the steps left.

    >>> rounds_left(0, 10, 3, 5), rounds_left(5, 10, 3, 5), rounds_left(0, 8, 4, 8)
    (4, 2, 2)
    """
    n = 0
    while steps_done < steps:
        steps_done += min(interval, steps_per_epoch - steps_done % steps_per_epoch)
        n += 1
    return n


class _RoundLog:
    """The runner's log line every tenth of the rounds, and the ``--backup_dir`` saves (a Keras callback)."""

    def __init__(self, trainer: Any, backup_dir: str, steps: int, steps_per_epoch: int, out: TextIO) -> None:
        self.trainer, self.backup_dir, self.steps, self.spe, self.out = (
            trainer,
            backup_dir,
            steps,
            steps_per_epoch,
            out,
        )
        self.total: Optional[int] = None
        self.every = 4

    def _plan(self) -> None:
        t = self.trainer
        if t._auto is not None and not t._auto.chosen:  # pylint: disable=protected-access
            return  # auto: known once H is chosen
        self.total = t.rounds + rounds_left(t.steps_done, self.steps, t.interval, self.spe)
        self.every = max(1, self.total // 10)

    def after_round(self) -> None:
        t = self.trainer
        if self.total is None:
            self._plan()
        rec, r = t.history[-1], t.rounds - 1
        last = t.steps_done >= self.steps
        if r % self.every == 0 or last:
            print(
                f"round {r + 1}/{self.total or '?'}: loss {rec['loss']:.4f}, compute {rec['compute_s'] * 1e3:.1f} ms, "
                f"comm {rec['comm_s'] * 1e3:.1f} ms, {rec['bytes'] / 1e6:.3f} MB, workers {rec['workers']}",
                file=self.out,
                flush=True,
            )
        if self.backup_dir and ((r + 1) % self.every == 0 or last):
            t.save(self.backup_dir)

    def callback(self) -> Any:
        import tf_keras

        log = self

        class RoundLog(tf_keras.callbacks.Callback):
            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                log.after_round()

        return RoundLog()


def _interval_and_correction(cfg: Config) -> Tuple[Any, str]:
    """(H, correction) of ``cfg`` on a ps cluster; InputError naming the flag it cannot honour."""
    if cfg.strategy not in PS_STRATEGIES:
        raise InputError(
            f"--strategy={cfg.strategy} cannot run on a cluster with ps tasks; use one of "
            f"{', '.join(PS_STRATEGIES)}",
            where="--strategy",
        )
    if not cfg.learning_rate > 0:
        raise InputError(
            f"must be > 0 on a parameter-server cluster, got {cfg.learning_rate!r}", where="--learning_rate"
        )
    if cfg.warmup_steps:
        raise InputError(
            "warm-up steps are not supported on a parameter-server cluster", where="--warmup_steps"
        )
    if cfg.overlap:
        raise InputError(
            "overlaps an all-reduce with local steps; a parameter-server round has no all-reduce "
            "(the closures' pushes and the averaging on the ps)",
            where="--overlap",
        )
    for name in (
        "step_times",
        "proc_stats",
        "eval_every",
        "eval_every_s",
        "target_accuracy",
        "slow_workers",
        "interval_search",
        "backup_every",
        "average_optimizer_state",
    ):
        if getattr(cfg, name):
            raise InputError("not supported on a parameter-server cluster", where=f"--{name}")
    if cfg.strategy == "ssgd":
        return 1, "none"
    return cfg.interval, "none" if cfg.strategy == "local_sgd" else cfg.correction


def skewed_order(y: Any, workers: int, classes: int, seed: int) -> Any:
    """Row order that makes worker i's shard (rows i, i + K, ...) its label-skewed shard of
    :func:`tf_commopt.datasets.split_non_iid` (each shard cut to the shortest one's length).

    >>> import numpy as np
    >>> order = skewed_order(np.repeat(np.arange(4), 10), 2, 2, seed=0)
    >>> len(order) % 2, len(set(order.tolist())) == len(order)
    (0, True)
    """
    import numpy as np

    from tf_commopt.datasets import split_non_iid

    shards = split_non_iid(y, workers, classes, seed=seed)
    m = min(len(s) for s in shards)
    return np.stack([np.asarray(s[:m]) for s in shards], axis=1).reshape(-1)


def _fit(model: Any, data: Any, log: _RoundLog, done: int, epochs: int, data_args: Dict[str, Any]) -> None:
    """Fit from ``done`` steps on; a run resumed inside an epoch first finishes that epoch (its rounds
    cut where the uninterrupted run's were)."""
    spe = data_args["steps_per_epoch"]
    epoch, into = divmod(done, spe)
    fit = dict(verbose=0, callbacks=[log.callback()])
    if into:
        args = {**data_args, "steps_per_epoch": spe - into}
        model.fit(data.x_train, data.y_train, epochs=epoch + 1, initial_epoch=epoch, **fit, **args)
        epoch += 1
    if epoch < epochs:
        model.fit(data.x_train, data.y_train, epochs=epochs, initial_epoch=epoch, **fit, **data_args)


def _record(cfg: Config, trainer: Any, tfc: Any, model: Any, run: Dict[str, Any]) -> Dict[str, Any]:
    from experiments.models import param_bytes

    stats = trainer.stats()
    record: Dict[str, Any] = build_record(
        strategy=cfg.strategy,
        model=cfg.model,
        dataset=cfg.dataset,
        replicas=tfc.num_workers,
        workers=tfc.num_workers + 1,
        global_batch_size=cfg.batch_size,
        steps=stats["steps"],
        epochs=run["epochs"],
        wall_s=run["wall"],
        train_loss=run["train_loss"],
        train_accuracy=run["train_acc"],
        test_loss=run["test_loss"],
        test_accuracy=run["test_acc"],
        seed=cfg.seed,
        learning_rate=cfg.learning_rate,
        params=model.count_params(),
        param_bytes=param_bytes(model),
        extra={
            "ps": tfc.num_ps,
            "interval": trainer.interval,
            "correction": trainer.correction,
            "syncs": stats["syncs"],
            "comm_s": round(stats["comm_s"], 4),
            "compute_s": round(stats["compute_s"], 4),
            "bytes_communicated": stats["bytes_communicated"],
            "first_round_s": stats["first_round_s"],
            "median_round_s": stats["median_round_s"],
            "lost_workers": sorted(trainer.lost_workers),
            "optimizer": cfg.optimizer,
            "rejoined_workers": trainer.rejoined_workers,
        },
    )
    auto = ("interval_t_comm_s", "interval_t_comp_s", "interval_overhead_s")
    record.update({k: stats[k] for k in auto if k in stats})
    if cfg.backup_dir:
        record["resumed_after_round"] = run["first"]
    return record


def run_training(cfg: Config, model_fn: Callable, out: Optional[TextIO] = None) -> Tuple[Dict[str, Any], Any]:
    """Train as ``cfg`` says on this parameter-server cluster.

    Example:
        >>> record, model = run_training(cfg, build_model)   # doctest: +SKIP

    ``model_fn(name, input_shape, num_classes)`` builds an uncompiled tf-keras model (logits).
    Returns (record, plain model with the trained weights) on the chief; never returns on workers/ps.
    """
    from experiments.collective import load_data, schedule
    from experiments.optimizers import build_optimizer
    from tf_commopt.distribute import ps as psc

    out = out or sys.stdout
    tfc = psc.serve_unless_chief(tf_config_from_env())
    interval, correction = _interval_and_correction(cfg)
    import tf_keras

    workers = tfc.num_workers
    if cfg.batch_size % workers:
        raise InputError(f"{cfg.batch_size} is not divisible by the {workers} workers", where="--batch_size")
    data = load_data(cfg)
    if cfg.non_iid_classes:  # worker i's rows i, i + K, ... are its label-skewed shard
        order = skewed_order(data.y_train, workers, cfg.non_iid_classes, cfg.seed)
        data = dataclasses.replace(data, x_train=data.x_train[order], y_train=data.y_train[order])
    epochs, steps_per_epoch = schedule(cfg, len(data.x_train))
    steps = epochs * steps_per_epoch
    tf_keras.utils.set_random_seed(cfg.seed)
    trainer = psc.ParameterServerSkipCorrect(
        interval=interval,
        correction=correction,
        correction_lr=cfg.correction_lr,
        target_ratio=float(cfg.target_ratio),
        max_interval=cfg.max_interval,
    )
    loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with trainer.scope():
        model = model_fn(cfg.model, data.input_shape, data.num_classes)
        model.compile(optimizer=build_optimizer(cfg.optimizer, cfg.learning_rate, cfg.momentum), loss=loss)
    psc.wrap(model, trainer)
    # the data set's order (load_dataset shuffled it with --seed); shard i = rows i, i + K, ...
    data_args = dict(batch_size=cfg.batch_size, shuffle=False, steps_per_epoch=steps_per_epoch)
    psc.prepare(model, data.x_train, data.y_train, trainer=trainer, **data_args)
    first = trainer.restore_latest(cfg.backup_dir) if cfg.backup_dir else 0
    if first:
        print(f"resuming after round {first} from {cfg.backup_dir}", file=out, flush=True)
    print(
        f"{cfg.strategy} (parameter server): {cfg.model} on {cfg.dataset} ({len(data.x_train)} train / "
        f"{len(data.x_test)} test), {workers} workers + {tfc.num_ps} ps, global batch {cfg.batch_size}, "
        f"optimizer {cfg.optimizer}, interval {interval}, correction {trainer.correction}, {steps} steps "
        f"({epochs} x {steps_per_epoch})",
        file=out,
        flush=True,
    )
    log = _RoundLog(trainer, cfg.backup_dir, steps, steps_per_epoch, out)
    t0 = time.perf_counter()
    _fit(model, data, log, trainer.steps_done, epochs, data_args)
    run: Dict[str, Any] = dict(wall=time.perf_counter() - t0, epochs=epochs, first=first)
    plain = model_fn(cfg.model, data.input_shape, data.num_classes)
    plain.set_weights(model.get_weights())
    plain.compile(loss=loss, metrics=["accuracy"])
    run["train_loss"], run["train_acc"] = plain.evaluate(
        data.x_train, data.y_train, batch_size=500, verbose=0
    )
    run["test_loss"], run["test_acc"] = plain.evaluate(data.x_test, data.y_test, batch_size=500, verbose=0)
    record = _record(cfg, trainer, tfc, model, run)
    save_result(cfg.model_dir, record, plain)
    print(
        f"\n{cfg.strategy} on {workers} workers + {tfc.num_ps} ps: {record['steps']} steps in "
        f"{run['wall']:.1f} s; final train loss {run['train_loss']:.4f}, test accuracy "
        f"{100 * run['test_acc']:.1f}% on {len(data.x_test)} held-out images",
        file=out,
    )
    print(json.dumps(record), file=out, flush=True)
    return record, plain
