"""The training runner: one model, one data set, one distribution strategy; ends with one JSON line.

``python -m experiments.train`` with no flags is the README's main job: the bundled 5,000 real MNIST
images, a small CNN, synchronous data parallelism (``ssgd``) over 4 local replicas (logical CPU
devices), the Keras progress bar, a short summary and one final JSON line.

Under ``TF_CONFIG`` (e.g. started by ``python -m tf_commopt.cluster``) every worker runs this same
command: ``ssgd`` is then MultiWorkerMirroredStrategy (one CPU replica per worker), each worker reads
its own shard of the training set, and only the chief (worker 0 when there is no chief) prints the
JSON line and writes ``--model_dir``.

With ``--backup_dir`` every task backs up its state at each epoch end and the same command, run again
after a crash, resumes after the last epoch every task completed (docs/reliability.md).

Strategies: ``single`` (one device), ``ssgd`` (MirroredStrategy / MultiWorkerMirroredStrategy),
``skip_correct`` and ``local_sgd`` (tf_commopt.distribute.SkipCorrectStrategy; local_sgd = no
correction; ``--overlap`` hides each sync's all-reduce behind the next local steps). ``--batch_size`` is the
global batch, split evenly over the replicas. ``--non_iid_classes=k`` gives every worker a label-skewed
shard (k labels mostly; it shards per worker, so it changes nothing without TF_CONFIG).

Example:
    python -m experiments.train --strategy=single --model=mlp --steps=50
    python -m tf_commopt.cluster --workers 2 --bandwidth-mbit 100 -- \\
        python -m experiments.train --strategy=ssgd --model=mlp --steps=20 --bench_allreduce_mb=4
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, TextIO, Union

from absl import flags, logging  # noqa: E402

from experiments.data import train_dataset_fn  # noqa: E402  (TensorFlow only when called)
from experiments.models import MODELS  # noqa: E402
from experiments.record import build_record, save_result  # noqa: E402
from tf_commopt.core.interval import validate_interval, validate_target_ratio  # noqa: E402
from tf_commopt.core.tfconfig import TFConfig, tf_config_from_env  # noqa: E402
from tf_commopt.datasets import DATASETS  # noqa: E402
from tf_commopt.errors import InputError, TfCommoptError  # noqa: E402

STRATEGIES = ("single", "ssgd", "skip_correct", "local_sgd")
from experiments.optimizers import build_optimizer, validate_optimizer  # noqa: E402  (TensorFlow only when building)
from tf_commopt.distribute.correction import CORRECTIONS, validate_correction_lr  # noqa: E402  (pure: no TensorFlow import)

FLAGS = flags.FLAGS
flags.DEFINE_string("strategy", "ssgd", f"one of {', '.join(STRATEGIES)}")
flags.DEFINE_string("model", "cnn", f"one of {', '.join(MODELS)}")
flags.DEFINE_string("dataset", "mnist", "mnist (bundled 5,000 images), cifar10 or mnist_full (download)")
flags.DEFINE_integer("batch_size", 128, "global batch size (split evenly over the replicas)")
flags.DEFINE_integer("epochs", 10, "passes over the training set (ignored when --steps > 0)")
flags.DEFINE_integer("steps", 0, "train exactly this many global steps (0 = use --epochs)")
flags.DEFINE_integer("replicas", 4, "local replicas (logical CPU devices) when there is no TF_CONFIG")
flags.DEFINE_integer("seed", 0, "random seed (weights, data order, train/test split)")
flags.DEFINE_string("model_dir", "", "write weights and result.json here (chief only); empty = nowhere")
flags.DEFINE_float("learning_rate", 0.05, "SGD learning rate")
flags.DEFINE_float("momentum", 0.9, "SGD momentum")
flags.DEFINE_string(
    "optimizer",
    "sgd",
    "sgd, adam, rmsprop or adagrad (tf-keras defaults, --learning_rate; --momentum is SGD's)",
)
flags.DEFINE_string("interval", "4", "skip_correct/local_sgd: steps between averagings, or 'auto'")
flags.DEFINE_string(
    "correction",
    "auto",
    "skip_correct: auto (vrl for plain SGD, gradient otherwise), gradient, "
    "vrl or none (local_sgd forces none)",
)
flags.DEFINE_integer("warmup_steps", 0, "skip_correct/local_sgd: synchronous steps before skipping")
flags.DEFINE_float("target_ratio", 1.0, "--interval=auto: aimed communication/computation time ratio")
flags.DEFINE_integer("max_interval", 256, "--interval=auto: cap on the chosen H")
flags.DEFINE_integer(
    "auto_probe_interval",
    16,
    "--interval=auto: H while measuring (after 2 warm-up steps, 3 "
    "timed syncs: H is chosen after 2 + 3 x this many steps)",
)
flags.DEFINE_string(
    "correction_lr",
    "effective",
    "skip_correct: the lr in the vrl update: effective "
    "(lr/(1-momentum)) or optimizer (the optimizer's lr; see docs/skip_correct.md)",
)
flags.DEFINE_float("bench_allreduce_mb", 0.0, "after training, time an all-reduce of this many MB (0 = off)")
flags.DEFINE_integer(
    "steps_per_execution",
    1,
    "training steps per call of the traced train function (tf-keras "
    "compile(steps_per_execution=...)); skip_correct keeps its exact H rhythm inside a call",
)
flags.DEFINE_integer("bench_repeats", 3, "timed repetitions of the all-reduce benchmark")
flags.DEFINE_bool(
    "overlap",
    False,
    "skip_correct/local_sgd: run each sync's all-reduce in the background while the "
    "replicas keep stepping; the stale average is applied at the next sync (docs/skip_correct.md)",
)
flags.DEFINE_integer(
    "non_iid_classes",
    0,
    "0: iid shards; k > 0: label-skewed shards, each worker's mostly holding "
    "k labels (tf_commopt.datasets.split_non_iid)",
)
flags.DEFINE_string(
    "backup_dir",
    "",
    "resume: every task checkpoints here at each epoch end and a restarted run "
    "continues from the last epoch every task completed (per-epoch seeded data order)",
)


@dataclass
class Config:
    """Everything one run needs; ``Config()`` is the README's main job."""

    strategy: str = "ssgd"
    model: str = "cnn"
    dataset: str = "mnist"
    batch_size: int = 128
    epochs: int = 10
    steps: int = 0
    replicas: int = 4
    seed: int = 0
    model_dir: str = ""
    learning_rate: float = 0.05
    momentum: float = 0.9
    optimizer: str = "sgd"
    interval: Union[int, str] = 4
    correction: str = "auto"
    warmup_steps: int = 0
    correction_lr: str = "effective"
    target_ratio: float = 1.0
    max_interval: int = 256
    auto_probe_interval: int = 16
    bench_allreduce_mb: float = 0.0
    bench_repeats: int = 3
    backup_dir: str = ""
    steps_per_execution: int = 1
    overlap: bool = False
    non_iid_classes: int = 0


@dataclass
class RunResult:
    """The JSON record (``record``) and the trained model as a plain (un-distributed) Keras model."""

    record: Dict[str, Any]
    model: Any


def validate(cfg: Config) -> Config:
    """Check every field; InputError naming the flag otherwise. Returns cfg (interval parsed)."""
    if cfg.strategy not in STRATEGIES:
        raise InputError(
            f"unknown strategy {cfg.strategy!r}; choose one of {', '.join(STRATEGIES)}", where="--strategy"
        )
    if cfg.model not in MODELS:
        raise InputError(f"unknown model {cfg.model!r}; choose one of {', '.join(MODELS)}", where="--model")
    if cfg.dataset not in DATASETS:
        raise InputError(
            f"unknown dataset {cfg.dataset!r}; choose one of {', '.join(DATASETS)}", where="--dataset"
        )
    for name, low in (
        ("batch_size", 1),
        ("epochs", 1),
        ("steps", 0),
        ("replicas", 1),
        ("warmup_steps", 0),
        ("bench_repeats", 1),
        ("max_interval", 1),
        ("auto_probe_interval", 1),
        ("steps_per_execution", 1),
        ("non_iid_classes", 0),
    ):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise InputError(f"must be an integer >= {low}, got {v!r}", where=f"--{name}")
    for name in ("learning_rate", "bench_allreduce_mb"):
        v = getattr(cfg, name)
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise InputError(f"must be a number >= 0, got {v!r}", where=f"--{name}")
    if not (math.isfinite(cfg.momentum) and 0 <= cfg.momentum < 1):
        raise InputError(f"must be in [0, 1), got {cfg.momentum!r}", where="--momentum")
    validate_optimizer(cfg.optimizer)
    cfg.interval = validate_interval(cfg.interval, where="--interval")
    validate_target_ratio(cfg.target_ratio, where="--target_ratio")
    validate_correction_lr(cfg.correction_lr, where="--correction_lr")
    for name in ("model_dir", "backup_dir"):
        d = getattr(cfg, name)
        if d and os.path.exists(d) and not os.path.isdir(d):
            raise InputError(f"{d!r} exists and is not a directory", where=f"--{name}")
    if not isinstance(cfg.overlap, bool):
        raise InputError(f"must be true or false, got {cfg.overlap!r}", where="--overlap")
    if cfg.overlap and cfg.strategy not in ("skip_correct", "local_sgd"):
        raise InputError(
            f"overlaps the syncs of skip_correct/local_sgd; --strategy={cfg.strategy} has none",
            where="--overlap",
        )
    if cfg.non_iid_classes and cfg.backup_dir:
        raise InputError(
            "label-skewed shards are not resumable with --backup_dir yet (its per-epoch data order is iid)",
            where="--non_iid_classes",
        )
    if cfg.correction not in CORRECTIONS:
        raise InputError(
            f"unknown correction {cfg.correction!r}; choose one of {', '.join(CORRECTIONS)}",
            where="--correction",
        )
    return cfg


def config_from_flags() -> Config:
    """A validated Config from the parsed absl flags."""
    names = [f for f in Config.__dataclass_fields__]
    return validate(Config(**{n: getattr(FLAGS, n) for n in names}))


# --------------------------------------------------------------------------------------------- devices
def configure_local_cpus(n: int) -> List[str]:
    """Make ``n`` logical CPU devices (before any op runs) and return their names.

    If TensorFlow already has logical CPUs configured (e.g. by a test's conftest), the first ``n`` of
    them are used; InputError if there are fewer than ``n``.
    """
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    have = tf.config.get_logical_device_configuration(cpu)
    if not have:
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
        target_ratio=float(cfg.target_ratio),
        max_interval=cfg.max_interval,
        auto_probe_interval=cfg.auto_probe_interval,
        overlap=cfg.overlap,
    )
    if multi:
        return SkipCorrectStrategy(
            cluster_resolver=tf.distribute.cluster_resolver.TFConfigClusterResolver(), **kwargs
        )
    return SkipCorrectStrategy(devices=configure_local_cpus(cfg.replicas), **kwargs)


# ------------------------------------------------------------------------------------------------ data
_train_dataset_fn = train_dataset_fn  # each worker reads its own shard (experiments.data), label-skewed with non_iid_classes > 0


def _epoch_dataset_fn(
    x, y, global_batch: int, seed: int, steps_per_epoch: int, first_epoch: int, epochs: int
):
    """Like ``_train_dataset_fn`` but epoch e's batches depend only on (seed, e, shard): a run resumed at
    epoch e reads exactly what the uninterrupted run read there (element i goes to shard i mod N)."""
    import tensorflow as tf

    def fn(ctx: tf.distribute.InputContext):
        per_replica = ctx.get_per_replica_batch_size(global_batch)
        batches = steps_per_epoch * (ctx.num_replicas_in_sync // ctx.num_input_pipelines)  # per pipeline
        xs = tf.constant(x[ctx.input_pipeline_id :: ctx.num_input_pipelines])
        ys = tf.constant(y[ctx.input_pipeline_id :: ctx.num_input_pipelines])

        def epoch(e):
            order = tf.random.experimental.stateless_shuffle(
                tf.range(tf.shape(xs, out_type=tf.int64)[0]), seed=tf.stack([tf.constant(seed, tf.int64), e])
            )
            ds = tf.data.Dataset.from_tensor_slices(order).repeat().batch(per_replica, drop_remainder=True)
            return ds.take(batches).map(lambda i: (tf.gather(xs, i), tf.gather(ys, i)))

        from tf_commopt._compat import no_autotune

        return no_autotune(tf.data.Dataset.range(first_epoch, epochs).flat_map(epoch).prefetch(2))

    return fn


def _backup_epochs(task_dir: str) -> List[int]:
    """Epochs with a complete backup in ``task_dir`` (an ``epoch-N`` directory appears by atomic rename)."""
    try:
        names = os.listdir(task_dir)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(n[6:]) for n in names if n.startswith("epoch-") and n[6:].isdigit())


def resume_epoch(backup_dir: str, tasks: List[str]) -> int:
    """The last epoch every task has a complete backup of (0: start afresh)."""
    return min(max(_backup_epochs(os.path.join(backup_dir, t)), default=0) for t in tasks)


def restore_backup(model: Any, path: str) -> None:
    """Load a backup into ``model`` (optimizer and strategy state too); one-line InputError if it is
    missing, truncated, corrupt or written by another model."""
    import tensorflow as tf

    try:
        model.load_weights(path).assert_existing_objects_matched()
    except (tf.errors.OpError, ValueError, AssertionError, OSError, IndexError, KeyError) as e:
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise InputError(
            f"cannot restore this backup (truncated, corrupt or from another model?): "
            f"{type(e).__name__}: {first}",
            where=path,
        ) from None


def _backup_callback(tf_keras: Any, model: Any, task_dir: str):
    """Keras callback: at each epoch end save weights + optimizer + strategy state (a SkipCorrectStrategy
    averages first) to a temporary directory, then rename it to ``epoch-N``; keep the last two."""

    def save(epoch: int, logs: Any = None) -> None:
        n = epoch + 1
        tmp, final = os.path.join(task_dir, f".tmp-epoch-{n}"), os.path.join(task_dir, f"epoch-{n}")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_weights(os.path.join(tmp, "ckpt"))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in _backup_epochs(task_dir)[:-2]:
            shutil.rmtree(os.path.join(task_dir, f"epoch-{old}"), ignore_errors=True)

    return tf_keras.callbacks.LambdaCallback(on_epoch_end=save)


def time_allreduce(strategy, megabytes: float, repeats: int = 3) -> Dict[str, float]:
    """Median seconds of an all-reduce (sum) of ``megabytes`` MB of float32 per replica.

    Every worker of a multi-worker strategy must call it together. Returns ``allreduce_mb``,
    ``allreduce_s`` and ``allreduce_busbw_mbit`` = 2(N-1)/N x bytes x 8 / s / 1e6 (what each rank of
    a ring all-reduce sends per second; a link cap bounds it).
    """
    import tensorflow as tf

    n = max(1, int(megabytes * 1e6 / 4))

    def replica_fn():
        ctx = tf.distribute.get_replica_context()
        x = tf.fill([n], tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32))
        return ctx.all_reduce(tf.distribute.ReduceOp.SUM, x)[:1]

    @tf.function
    def step():
        return strategy.run(replica_fn)

    def once() -> float:
        t = time.perf_counter()
        out = strategy.experimental_local_results(step())
        got = float(out[0].numpy()[0])
        dt = time.perf_counter() - t
        r = strategy.num_replicas_in_sync
        if got != r * (r + 1) / 2:  # the sum 1 + 2 + ... + R: the reduce really happened
            raise RuntimeError(f"all-reduce returned {got}, expected {r * (r + 1) / 2}")
        return dt

    once()  # trace, set up the collective groups
    times = sorted(once() for _ in range(repeats))
    med = times[len(times) // 2]
    r = strategy.num_replicas_in_sync
    busbw = 2.0 * (r - 1) / r * n * 4 * 8 / med / 1e6
    return {"allreduce_mb": n * 4 / 1e6, "allreduce_s": med, "allreduce_busbw_mbit": busbw}


# ------------------------------------------------------------------------------------------------- run
def run(cfg: Config, out: Optional[TextIO] = None) -> RunResult:
    """Train as ``cfg`` says and return the record (printed as the last line on the chief).

    Example:
        >>> r = run(Config(strategy="single", model="mlp", steps=5))   # doctest: +SKIP
        >>> sorted(r.record)[:3]                                       # doctest: +SKIP
        ['dataset', 'epochs', 'global_batch_size']
    """
    out = out or sys.stdout
    validate(cfg)
    tfc = tf_config_from_env()
    if tfc is None:
        os.environ.pop(
            "TF_CONFIG", None
        )  # a blank TF_CONFIG: TensorFlow's resolver would json.loads("") and fail
    if tfc is not None and tfc.num_ps:  # parameter-server cluster (issue 8): its own loop, workers/ps serve
        from experiments.models import build_model
        from experiments.ps_train import run_training

        return RunResult(*run_training(cfg, build_model, out))
    strategy = make_strategy(cfg, tfc)  # before any op: logical devices / collective set-up

    import tf_keras

    from experiments.models import build_model, param_bytes
    from tf_commopt._compat import device_iterators_without_autotune
    from tf_commopt.datasets import load_dataset

    device_iterators_without_autotune()  # else deleting fit's input iterator can block for up to 60 s (skip_correct.md)

    multi = tfc is not None and cfg.strategy != "single"
    chief = tfc is None or tfc.is_chief or not multi
    tf_keras.utils.set_random_seed(cfg.seed)
    try:
        data = load_dataset(cfg.dataset, seed=cfg.seed)
    except TfCommoptError:
        raise
    except Exception as e:  # cifar10 / mnist_full download through tf.keras.datasets
        raise InputError(
            f"cannot load {cfg.dataset!r} (it downloads: internet needed; 'mnist' is bundled): "
            f"{' '.join(str(e).split())[:300]}",
            where="--dataset",
        ) from None
    replicas = strategy.num_replicas_in_sync
    if cfg.batch_size % replicas:
        raise InputError(
            f"{cfg.batch_size} is not divisible by the {replicas} replicas", where="--batch_size"
        )
    if cfg.steps:
        epochs, steps_per_epoch = 1, cfg.steps
    else:
        epochs, steps_per_epoch = cfg.epochs, max(1, len(data.x_train) // cfg.batch_size)

    with strategy.scope():
        model = build_model(cfg.model, data.input_shape, data.num_classes)
        model.compile(
            optimizer=build_optimizer(cfg.optimizer, cfg.learning_rate, cfg.momentum),
            loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            steps_per_execution=cfg.steps_per_execution,
        )
    callbacks, first_epoch = [], 0
    if cfg.backup_dir:
        tasks = (
            [f"{t}-{i}" for t in ("chief", "worker") for i in range(len(tfc.cluster.get(t, [])))]
            if multi
            else ["local"]
        )
        task_dir = os.path.join(cfg.backup_dir, f"{tfc.task_type}-{tfc.task_index}" if multi else "local")
        first_epoch = min(resume_epoch(cfg.backup_dir, tasks), epochs)
        if first_epoch:
            restore_backup(model, os.path.join(task_dir, f"epoch-{first_epoch}", "ckpt"))
            print(f"resuming after epoch {first_epoch} from {task_dir}", file=out, flush=True)
        callbacks.append(_backup_callback(tf_keras, model, task_dir))
        train = strategy.distribute_datasets_from_function(
            _epoch_dataset_fn(
                data.x_train, data.y_train, cfg.batch_size, cfg.seed, steps_per_epoch, first_epoch, epochs
            )
        )
    else:
        train = strategy.distribute_datasets_from_function(
            _train_dataset_fn(data.x_train, data.y_train, cfg.batch_size, cfg.seed, cfg.non_iid_classes)
        )
    where = (
        f"{tfc.task_type}:{tfc.task_index} of {replicas} workers" if multi else f"{replicas} local replica(s)"
    )
    if chief:
        print(
            f"{cfg.strategy}: {cfg.model} on {cfg.dataset} ({len(data.x_train)} train / {len(data.x_test)} test), "
            f"{where}, global batch {cfg.batch_size}, {epochs} x {steps_per_epoch} steps",
            file=out,
            flush=True,
        )
    first_step: List[float] = []
    last_step: List[float] = [0.0]
    train_end: List[float] = []

    class _FirstStep(tf_keras.callbacks.Callback):  # first_step_s (tracing, set-up) and last_step_end_s
        _supports_tf_logs = True

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            last_step[0] = time.perf_counter() - t0
            if not first_step:
                first_step.append(last_step[0])

        def on_train_end(self, logs: Any = None) -> None:
            train_end.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    history = model.fit(
        train,
        epochs=epochs,
        initial_epoch=first_epoch,
        steps_per_epoch=steps_per_epoch,
        callbacks=callbacks + [_FirstStep()],
        verbose=1 if chief else 0,
    )
    wall = time.perf_counter() - t0
    if hasattr(strategy, "sync"):
        strategy.sync()  # average the local models before evaluating / saving
    bench = (
        time_allreduce(strategy, cfg.bench_allreduce_mb, cfg.bench_repeats) if cfg.bench_allreduce_mb else {}
    )

    # evaluate a plain copy of the trained weights: same numbers whatever the strategy, no collectives
    plain = build_model(cfg.model, data.input_shape, data.num_classes)
    plain.set_weights(model.get_weights())
    plain.compile(loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    test_loss, test_acc = plain.evaluate(data.x_test, data.y_test, batch_size=500, verbose=0)

    steps = int(model.optimizer.iterations.numpy())
    record: Dict[str, Any] = build_record(
        strategy=cfg.strategy,
        model=cfg.model,
        dataset=cfg.dataset,
        replicas=replicas,
        workers=(tfc.num_workers + int(tfc.has_chief)) if multi else 1,
        global_batch_size=cfg.batch_size,
        steps=steps,
        epochs=epochs,
        wall_s=wall,
        train_loss=(history.history.get("loss") or [math.nan])[-1],
        train_accuracy=(history.history.get("accuracy") or [math.nan])[-1],
        test_loss=test_loss,
        test_accuracy=test_acc,
        seed=cfg.seed,
        learning_rate=cfg.learning_rate,
        params=model.count_params(),
        param_bytes=param_bytes(model),
    )
    if cfg.strategy in ("skip_correct", "local_sgd"):
        stats = strategy.stats()
        record["interval"] = getattr(strategy, "interval", stats.get("interval"))
        record["overlap"] = cfg.overlap
        for k in (
            "syncs",
            "comm_s",
            "first_sync_s",
            "compute_s",
            "bytes_communicated",
            "background_comm_s",
            "drain_wait_s",
            "interval_t_comm_s",
            "interval_t_comp_s",
            "interval_t_comm_samples_s",
            "interval_t_comp_samples_s",
            "interval_overhead_s",
            "interval_selection_comm_s",
        ):
            if k in stats:
                record[k] = stats[k]
    if first_step:  # fit start to the end of the first step (tracing, set-up): what no overlap can hide
        record["first_step_s"] = round(first_step[0], 3)
        record["last_step_end_s"] = round(last_step[0], 3)
    if train_end:  # wall_s − this: fit's return path (tf-keras tears down its data handler; see overlap.md)
        record["train_end_s"] = round(train_end[0], 3)
    if cfg.non_iid_classes:
        record["non_iid_classes"] = cfg.non_iid_classes
    if cfg.backup_dir:
        record["resumed_after_epoch"] = first_epoch
    record.update({k: round(v, 4) for k, v in bench.items()})
    if chief:
        save_result(cfg.model_dir, record, plain)
        print(
            f"\n{cfg.strategy} on {where}: {steps} steps in {wall:.1f} s; "
            f"final train loss {record['train_loss']:.4f}, test accuracy {100 * test_acc:.1f}% "
            f"on {len(data.x_test)} held-out images",
            file=out,
        )
        if bench:
            print(
                f"all-reduce of {bench['allreduce_mb']:.2f} MB: {bench['allreduce_s']:.3f} s "
                f"({bench['allreduce_busbw_mbit']:.1f} Mbit/s per rank)",
                file=out,
            )
        print(json.dumps(record), file=out, flush=True)
    return RunResult(record, plain)


# ------------------------------------------------------------------------------------------------- CLI
def _error(message: str) -> None:
    sys.stderr.write(f"experiments.train: error: {' '.join(str(message).split())}\n")
    sys.stderr.flush()
    sys.exit(2)


def main(argv: List[str]) -> None:
    if not FLAGS["verbosity"].present:  # TF's per-step INFO lines drown the progress bar
        logging.set_verbosity(logging.WARNING)
        import logging as pylogging

        pylogging.getLogger("tensorflow").setLevel(pylogging.WARNING)
    if len(argv) > 1:
        _error(f"unexpected argument(s): {' '.join(argv[1:])}")
    try:
        cfg = config_from_flags()
        run(cfg)
    except TfCommoptError as e:
        _error(str(e))


if __name__ == "__main__":
    from experiments import _cli

    _cli.run(main)  # bad flags: one line, exit 2; dashed aliases; quiet TensorFlow
