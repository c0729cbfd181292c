"""Resumable training of the collective runner (``--backup_dir``): per-epoch data order, backups, resume.

Every task saves weights, optimizer and strategy state to ``<backup_dir>/<task>/epoch-N`` at each epoch
end (written to a temporary directory, then renamed); a restarted run resumes after the last epoch every
task completed and reads exactly the batches the uninterrupted run read from there on.

Example:
    >>> resume_epoch("/nonexistent", ["local"])
    0
"""

from __future__ import annotations

import os
import shutil
from typing import Any, List, Tuple

from tf_commopt.errors import InputError

__all__ = ["epoch_dataset_fn", "resume_epoch", "restore_backup", "backup_callback", "backup_tasks"]


def epoch_dataset_fn(x, y, global_batch: int, seed: int, steps_per_epoch: int, first_epoch: int, epochs: int):
    """Like ``experiments.data.train_dataset_fn`` but epoch e's batches depend only on (seed, e, shard): a run resumed at
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


def backup_callback(tf_keras: Any, model: Any, task_dir: str):
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


def backup_tasks(tfc: Any, multi: bool, backup_dir: str) -> Tuple[List[str], str]:
    """Every task's backup name and this task's backup directory (``local`` without a cluster)."""
    if not multi:
        return ["local"], os.path.join(backup_dir, "local")
    tasks = [f"{t}-{i}" for t in ("chief", "worker") for i in range(len(tfc.cluster.get(t, [])))]
    return tasks, os.path.join(backup_dir, f"{tfc.task_type}-{tfc.task_index}")
