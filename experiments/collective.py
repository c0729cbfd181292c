"""The collective trainer of the runner: ``single``, ``ssgd``, ``skip_correct`` and ``local_sgd`` with
tf-keras ``model.fit``, on local replicas or a ``TF_CONFIG`` cluster without ps tasks.

Example:
    >>> from experiments.config import Config
    >>> r = run_collective(Config(strategy="single", model="mlp", steps=5), None)   # doctest: +SKIP
    >>> r.record["steps"]                                                           # doctest: +SKIP
    5
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, TextIO

from experiments.config import SYNC_STRATEGIES, Config
from experiments.record import build_record, save_result
from tf_commopt.core.period import TimeBudget
from tf_commopt.core.tfconfig import TFConfig
from tf_commopt.errors import InputError, TfCommoptError

__all__ = ["RunResult", "configure_local_cpus", "make_strategy", "run_collective"]

SYNC_STATS = tuple(  # the strategy's stats() kept in the record
    "syncs comm_s first_sync_s compute_s bytes_communicated background_comm_s drain_wait_s interval_t_comm_s "
    "interval_t_comp_s interval_t_comm_samples_s interval_t_comp_samples_s interval_overhead_s "
    "interval_selection_comm_s host_interval host_syncs host_comm_s inter_host_bytes interval_t_intra_s "
    "interval_t_inter_s interval_t_intra_samples_s".split()
)


@dataclass
class RunResult:
    """The JSON record (``record``) and the trained model as a plain (un-distributed) Keras model."""

    record: Dict[str, Any]
    model: Any


# --------------------------------------------------------------------------------------------- devices
def configure_local_cpus(n: int) -> List[str]:
    """Make ``n`` logical CPU devices (before any op runs) and return their names.

    If TensorFlow already has logical CPUs configured (e.g. by a test's conftest), the first ``n`` of
    them are used; InputError if there are fewer than ``n``.
    """
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    if not tf.config.get_logical_device_configuration(cpu):
        try:
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
        except RuntimeError:  # the runtime started already: use what it has
            pass
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(devices) < n:
        raise InputError(
            f"{n} replicas asked for but TensorFlow was already started with {len(devices)} "
            "logical CPU device(s) in this process",
            where="--replicas",
        )
    return devices[:n]


def make_strategy(cfg: Config, tfc: Optional[TFConfig]):
    """The tf.distribute strategy for ``cfg`` (TF_CONFIG decides multi-worker vs local)."""
    import tensorflow as tf

    multi = tfc is not None and cfg.strategy != "single"
    if multi and tfc.num_ps:
        raise InputError(
            f"--strategy={cfg.strategy} is collective (all-reduce): the cluster must not have ps tasks",
            where="TF_CONFIG",
        )
    if cfg.strategy == "tf_ps_async":
        raise InputError(
            "TensorFlow's ParameterServerStrategy needs a cluster with ps tasks", where="--strategy"
        )
    if cfg.strategy == "single":
        return tf.distribute.OneDeviceStrategy(configure_local_cpus(1)[0])
    if cfg.strategy == "ssgd":
        if multi:
            return tf.distribute.MultiWorkerMirroredStrategy()
        from tf_commopt._compat import fresh_mirrored_strategy  # its own collective keys

        return fresh_mirrored_strategy(configure_local_cpus(cfg.replicas))
    try:  # skip_correct / local_sgd: another module, imported only when asked for
        from tf_commopt.distribute.skip_correct import SkipCorrectStrategy
    except ImportError as e:
        raise InputError(
            f"--strategy={cfg.strategy} needs tf_commopt.distribute.skip_correct, which cannot be "
            f"imported here ({e})",
            where="--strategy",
        ) from None
    kwargs = dict(
        interval=cfg.interval,
        correction="none" if cfg.strategy == "local_sgd" else cfg.correction,
        warmup_steps=cfg.warmup_steps,
        correction_lr=cfg.correction_lr,
        average_optimizer_state=cfg.average_optimizer_state,
        target_ratio=float(cfg.target_ratio),
        max_interval=cfg.max_interval,
        auto_probe_interval=cfg.auto_probe_interval,
        overlap=cfg.overlap,
        compression=cfg.compression or None,
        period=TimeBudget(tau_eff=cfg.tau_eff) if cfg.period == "time" else cfg.period,
        host_interval=cfg.host_interval or None,
    )
    if multi:
        return SkipCorrectStrategy(
            cluster_resolver=tf.distribute.cluster_resolver.TFConfigClusterResolver(), **kwargs
        )
    return SkipCorrectStrategy(devices=configure_local_cpus(cfg.replicas), **kwargs)


def load_data(cfg: Config):
    """The data set of ``cfg`` (one-line InputError when a downloaded one cannot be had)."""
    from tf_commopt.datasets import load_dataset

    try:
        return load_dataset(cfg.dataset, seed=cfg.seed)
    except TfCommoptError:
        raise
    except Exception as e:  # cifar10 / mnist_full download through tf.keras.datasets
        raise InputError(
            f"cannot load {cfg.dataset!r} (it downloads: internet needed; 'mnist' is bundled): "
            f"{' '.join(str(e).split())[:300]}",
            where="--dataset",
        ) from None


def schedule(cfg: Config, rows: int) -> tuple:
    """(epochs, steps per epoch) of a run on ``rows`` training examples.

    >>> schedule(Config(steps=7), 4000), schedule(Config(epochs=2), 4000)
    ((1, 7), (2, 31))
    """
    if cfg.steps:
        return 1, cfg.steps
    return cfg.epochs, cfg.steps_per_epoch or max(1, rows // cfg.batch_size)


# ------------------------------------------------------------------------------------------ callbacks
def proc_status() -> Dict[str, float]:
    """This process's resident memory (MB), threads and open file descriptors, from /proc."""
    out: Dict[str, float] = {}
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k == "VmRSS":
                out["rss_mb"] = int(v.split()[0]) / 1024.0
            elif k == "Threads":
                out["threads"] = int(v)
    out["fds"] = len(os.listdir("/proc/self/fd"))
    return out


def _clock_callback(tf_keras: Any, clock: Dict[str, Any], cfg: Config, out: TextIO):
    """Records step ends, the end of training and (``--proc_stats``) the task's resources per epoch."""

    class Clock(tf_keras.callbacks.Callback):
        _supports_tf_logs = True

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            clock["base"] = clock["steps"][-1] if clock["steps"] else 0

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            clock["ends"].append(time.perf_counter())  # a call's end: batch is its last step
            clock["steps"].append(clock["base"] + batch + 1)

        def on_train_end(self, logs: Any = None) -> None:
            clock["train_end"] = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if cfg.proc_stats:
                now = time.perf_counter()
                rec = dict(epoch=epoch + 1, epoch_s=round(now - clock.setdefault("epoch_t", clock["t0"]), 3))
                clock["epoch_t"] = now
                lead = "\n" if self.params.get("verbose") else ""  # after the progress bar's line
                print(lead + "PROC " + json.dumps(dict(rec, **proc_status())), file=out, flush=True)

    return Clock()


def _timing(clock: Dict[str, Any], cfg: Config) -> Dict[str, Any]:
    """first_step_s, first_call_steps, last_step_end_s, train_end_s and (``--step_times``) the per-step
    figures. A call of the train function runs one step or several (``steps_per_execution``, the graph
    loop's steps up to the next sync): per-step times divide each call's time by its steps."""
    import numpy as np

    t0, ends, rec = clock["t0"], clock["ends"], {}
    if ends:  # fit start to the end of the first call (tracing, set-up): what no overlap can hide
        rec["first_step_s"] = round(ends[0] - t0, 3)
        rec["first_call_steps"] = int(clock["steps"][0])
        rec["last_step_end_s"] = round(ends[-1] - t0, 3)
    if "train_end" in clock:  # wall_s − this: fit's return path (tf-keras tears down its data handler)
        rec["train_end_s"] = round(clock["train_end"] - t0, 3)
    if cfg.step_times and len(ends) > 1:
        steps = np.asarray(clock["steps"], dtype=float)
        per_step = np.diff(ends) / np.maximum(np.diff(steps), 1.0)
        later = np.nonzero(steps[1:] > 10)[0]  # after step 10; short runs: keep at least one sample
        skip = min(int(later[0]) if len(later) else 0, len(per_step) - 1)
        rec["step_ms"] = round(1000 * float(np.median(per_step[skip:])), 3)
        rec["step_ms_p90"] = round(1000 * float(np.percentile(per_step[skip:], 90)), 3)
        rec["startup_s"] = round(ends[0] - clock["t_strategy"], 3)
    return rec


# ------------------------------------------------------------------------------------------------- run
def _compiled_model(cfg: Config, strategy: Any, data: Any):
    import tf_keras

    from experiments.models import build_model
    from experiments.optimizers import build_optimizer

    with strategy.scope():
        model = build_model(cfg.model, data.input_shape, data.num_classes)
        model.compile(
            optimizer=build_optimizer(cfg.optimizer, cfg.learning_rate, cfg.momentum),
            loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            steps_per_execution=cfg.steps_per_execution,
        )
    return model


def _slow_down(cfg: Config, strategy: Any, model: Any) -> float:
    """``--slow_workers``: this worker's factor, its train step stretched (experiments/slow.py)."""
    from experiments.slow import factor_for, parse_slow_workers, slow_train_step
    from tf_commopt import _compat

    if not cfg.slow_workers:
        return 1.0
    workers = _compat.num_workers(strategy)
    factor = factor_for(parse_slow_workers(cfg.slow_workers), _compat.worker_index(strategy), workers)
    slow_train_step(model, factor)
    return factor


def _input(cfg: Config, strategy: Any, data: Any, tfc: Any, multi: bool, model: Any, out: TextIO) -> tuple:
    """(distributed training set, callbacks, the run's :class:`~experiments.resume.Resume` or None):
    resumable with a backup directory (``--backup_dir``, or the launcher's when it restarts the job)."""
    from experiments import backup, resume
    from experiments.data import parse_batch_shares, train_dataset_fn

    epochs, steps_per_epoch = schedule(cfg, len(data.x_train))
    r = resume.prepare(cfg, tfc, multi, model, strategy, steps_per_epoch, out)
    shares = parse_batch_shares(cfg.batch_shares)
    if r is None:
        fn = train_dataset_fn(
            data.x_train, data.y_train, cfg.batch_size, cfg.seed, cfg.non_iid_classes, shares
        )
        return strategy.distribute_datasets_from_function(fn), [], None
    if shares is not None:
        raise InputError("a resumable run (a backup directory) has equal batches", where="--batch_shares")
    fn = backup.epoch_dataset_fn(
        data.x_train, data.y_train, cfg.batch_size, cfg.seed, steps_per_epoch, r.epoch, epochs, r.skip
    )
    return strategy.distribute_datasets_from_function(fn), [r.callback], r


def _evaluate(cfg: Config, model: Any, data: Any) -> tuple:
    """(plain copy of the trained model, test loss, test accuracy): the same numbers whatever the strategy."""
    from experiments.models import build_model, held_out_figures

    plain = build_model(cfg.model, data.input_shape, data.num_classes)
    plain.set_weights(model.get_weights())
    test_loss, test_acc = held_out_figures(plain, data.x_test, data.y_test)
    return plain, test_loss, test_acc


def _record(cfg: Config, run: Dict[str, Any]) -> Dict[str, Any]:
    from experiments.models import param_bytes

    model, strategy, history = run["model"], run["strategy"], run["history"]
    record = build_record(
        strategy=cfg.strategy,
        model=cfg.model,
        dataset=cfg.dataset,
        replicas=strategy.num_replicas_in_sync,
        workers=run["workers"],
        global_batch_size=cfg.batch_size,
        steps=int(model.optimizer.iterations.numpy()),
        epochs=run["epochs"],
        wall_s=run["wall"],
        train_loss=(history.history.get("loss") or [math.nan])[-1],
        train_accuracy=(history.history.get("accuracy") or [math.nan])[-1],
        test_loss=run["test_loss"],
        test_accuracy=run["test_acc"],
        seed=cfg.seed,
        learning_rate=cfg.learning_rate,
        params=model.count_params(),
        param_bytes=param_bytes(model),
    )
    if cfg.strategy in SYNC_STRATEGIES:
        stats = strategy.stats()
        record["interval"] = getattr(strategy, "interval", stats.get("interval"))
        record["overlap"] = bool(strategy.overlap)
        record["compression"] = strategy.compression or ""
        record["sync_payload_bytes"] = stats["sync_payload_bytes"]
        if cfg.period == "time":  # this worker's local steps and the counts of the last period
            record.update(
                period="time",
                tau_eff=stats["tau_eff"],
                real_steps=stats["real_steps"][0],
                period_steps=stats["period_steps"],
            )
        record.update({k: stats[k] for k in SYNC_STATS if k in stats})
    record.update(_timing(run["clock"], cfg))
    for name in ("non_iid_classes", "batch_shares", "average_optimizer_state"):  # recorded when set
        if getattr(cfg, name):
            record[name] = getattr(cfg, name)
    if cfg.slow_workers:
        record.update(slow_workers=cfg.slow_workers, slow_factor=run["slow_factor"])
    if run["resume"] is not None:
        record.update(run["resume"].record())
    record.update({k: round(v, 4) for k, v in run["bench"].items()})
    return record


def _summary(cfg: Config, record: Dict[str, Any], where: str, n_test: int, out: TextIO) -> None:
    print(
        f"\n{cfg.strategy} on {where}: {record['steps']} steps in {record['wall_s']:.1f} s; "
        f"final train loss {record['train_loss']:.4f}, test accuracy {100 * record['test_accuracy']:.1f}% "
        f"on {n_test} held-out images",
        file=out,
    )
    if "allreduce_s" in record:
        print(
            f"all-reduce of {record['allreduce_mb']:.2f} MB: {record['allreduce_s']:.3f} s "
            f"({record['allreduce_busbw_mbit']:.1f} Mbit/s per rank)",
            file=out,
        )
    print(json.dumps(record), file=out, flush=True)


def _add_ons(cfg: Config, strategy: Any, model: Any, data: Any, train: Any, callbacks: List[Any], steps: int):
    """``--interval_search`` and ``--eval_every``: their callbacks (appended) and the record's finisher."""
    import tf_keras

    from experiments import curve as curves
    from experiments.models import build_model
    from tf_commopt import _compat

    finishers = []
    if cfg.interval_search:
        more, finisher = curves.interval_search(cfg, model, strategy, train)
        callbacks[:0] = more
        finishers.append(finisher)
    if cfg.eval_every or cfg.eval_every_s:
        plain = build_model(cfg.model, data.input_shape, data.num_classes)
        target = cfg.target_accuracy or None
        multi = _compat.num_workers(strategy) > 1
        curve = curves.Curve(
            strategy, model, plain, data, cfg.eval_every, steps, cfg.steps_per_execution,
            every_s=cfg.eval_every_s, target=target, multi=multi,
        )  # fmt: skip
        curve.evaluate(0)
        callbacks.append(curve.callback(tf_keras))
        finishers.append(curve.record)

    def finish(record: Dict[str, Any]) -> Dict[str, Any]:
        for f in finishers:
            record = f(record)
        return record

    return finish


def run_collective(cfg: Config, tfc: Optional[TFConfig], out: Optional[TextIO] = None) -> RunResult:
    """Train as ``cfg`` says (``tfc``: this task's TF_CONFIG, None locally); the chief prints the record
    as its last line and writes ``--model_dir``."""
    import tensorflow  # noqa: F401  (start-up below is the strategy's, not the import's)
    import tf_keras

    out = out or sys.stdout
    clock: Dict[str, Any] = {"t_strategy": time.perf_counter(), "ends": [], "steps": [], "base": 0}
    strategy = make_strategy(cfg, tfc)  # before any op: logical devices / collective set-up

    from experiments.allreduce import end_barrier, time_allreduce
    from tf_commopt.tf.input_teardown import device_iterators_without_autotune

    device_iterators_without_autotune()  # else deleting fit's input iterator can block for up to 60 s
    multi = tfc is not None and cfg.strategy != "single"
    chief = tfc is None or tfc.is_chief or not multi
    tf_keras.utils.set_random_seed(cfg.seed)
    data = load_data(cfg)
    replicas = strategy.num_replicas_in_sync
    if cfg.batch_size % replicas:
        raise InputError(
            f"{cfg.batch_size} is not divisible by the {replicas} replicas", where="--batch_size"
        )
    epochs, steps_per_epoch = schedule(cfg, len(data.x_train))
    model = _compiled_model(cfg, strategy, data)
    slow_factor = _slow_down(cfg, strategy, model)
    train, callbacks, resume = _input(cfg, strategy, data, tfc, multi, model, out)
    first_epoch = resume.epoch if resume is not None else 0
    where = (
        f"{tfc.task_type}:{tfc.task_index} of {replicas} workers" if multi else f"{replicas} local replica(s)"
    )
    if chief:
        print(
            f"{cfg.strategy}: {cfg.model} on {cfg.dataset} ({len(data.x_train)} train / {len(data.x_test)} "
            f"test), {where}, global batch {cfg.batch_size}, {epochs} x {steps_per_epoch} steps",
            file=out,
            flush=True,
        )
    callbacks.append(_clock_callback(tf_keras, clock, cfg, out))
    finish = _add_ons(cfg, strategy, model, data, train, callbacks, epochs * steps_per_epoch)
    clock["t0"] = time.perf_counter()
    undo = resume.started(model) if resume is not None else None
    try:
        history = model.fit(
            train,
            epochs=epochs,
            initial_epoch=first_epoch,
            steps_per_epoch=steps_per_epoch,
            callbacks=callbacks,
            verbose=1 if chief else 0,
        )
    finally:
        if resume is not None:
            undo()
            resume.finish()  # Preempted: every task stopped at one step with a backup there
    wall = time.perf_counter() - clock["t0"]
    if hasattr(strategy, "sync"):
        strategy.sync()  # average the local models before evaluating / saving
    bench = (
        time_allreduce(strategy, cfg.bench_allreduce_mb, cfg.bench_repeats) if cfg.bench_allreduce_mb else {}
    )
    plain, test_loss, test_acc = _evaluate(cfg, model, data)
    workers = (tfc.num_workers + int(tfc.has_chief)) if multi else 1
    run = dict(model=model, strategy=strategy, history=history, workers=workers, epochs=epochs, wall=wall)
    run.update(test_loss=test_loss, test_acc=test_acc, clock=clock, resume=resume, bench=bench)
    run["slow_factor"] = slow_factor
    record = finish(_record(cfg, run))
    if chief:
        save_result(cfg.model_dir, record, plain)
        _summary(cfg, record, where, len(data.x_test), out)
    elif cfg.step_times:  # every worker's own step figures, as its last line (the harness's all_tasks)
        print(json.dumps(record), file=out, flush=True)
    if multi:
        end_barrier(strategy)  # no worker exits while a peer still pulls its part of the last all-reduce
    return RunResult(record, plain)
