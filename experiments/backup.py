"""Resumable training of the collective runner (``--backup_dir``): backups, the data order, the resume point.

Every task saves weights, optimizer and strategy state (a SkipCorrectStrategy averages first) to
``<backup_dir>/<task>/epoch-N`` at the end of epoch N and, with ``--backup_every=S``, to ``step-T`` at
every global step T that is a multiple of S; each is written to a temporary directory, then renamed, and
the last two are kept. A restarted run resumes at the last step every task has a backup of and reads
exactly the batches the uninterrupted run read from there on, so the backups are taken at the same
steps: it ends with the uninterrupted run's weights.

Example:
    >>> resume_point("/nonexistent", ["local"], steps_per_epoch=10)
    (0, None)
    >>> backup_step("epoch-3", 10), backup_step("step-25", 10), backup_step(".tmp-step-30", 10)
    (30, 25, None)
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any, Dict, List, Mapping, Optional, TextIO, Tuple

from tf_commopt.core.restart import BACKUP_DIR_ENV, launcher_backup_dir
from tf_commopt.errors import InputError

__all__ = [
    "epoch_dataset_fn",
    "backup_step",
    "resume_point",
    "resume_epoch",
    "restore_backup",
    "save_backup",
    "backup_name",
    "backup_tasks",
    "resolve_backup_dir",
    "KEEP",
]

KEEP = 2  # backups kept per task


def epoch_dataset_fn(
    x, y, global_batch: int, seed: int, steps_per_epoch: int, first_epoch: int, epochs: int, skip: int = 0
):
    """Like ``experiments.data.train_dataset_fn`` but epoch e's batches depend only on (seed, e, shard): a run resumed at
    epoch e, batch ``skip``, reads exactly what the uninterrupted run read there (element i goes to shard
    i mod N)."""
    import tensorflow as tf

    def fn(ctx: tf.distribute.InputContext):
        per_replica = ctx.get_per_replica_batch_size(global_batch)
        batches = steps_per_epoch * (ctx.num_replicas_in_sync // ctx.num_input_pipelines)  # per pipeline
        skipped = skip * (ctx.num_replicas_in_sync // ctx.num_input_pipelines)
        xs = tf.constant(x[ctx.input_pipeline_id :: ctx.num_input_pipelines])
        ys = tf.constant(y[ctx.input_pipeline_id :: ctx.num_input_pipelines])

        def epoch(e):
            order = tf.random.experimental.stateless_shuffle(
                tf.range(tf.shape(xs, out_type=tf.int64)[0]), seed=tf.stack([tf.constant(seed, tf.int64), e])
            )
            ds = tf.data.Dataset.from_tensor_slices(order).repeat().batch(per_replica, drop_remainder=True)
            return ds.take(batches).map(lambda i: (tf.gather(xs, i), tf.gather(ys, i)))

        from tf_commopt.tf.input_teardown import no_autotune

        ds = tf.data.Dataset.range(first_epoch, epochs).flat_map(epoch)
        return no_autotune((ds.skip(skipped) if skipped else ds).prefetch(2))

    return fn


def backup_step(name: str, steps_per_epoch: int) -> Optional[int]:
    """The global step a complete backup directory stands for (``epoch-N``: N epochs, ``step-T``: T), or
    None for anything else (a temporary directory, the ledger)."""
    for prefix, scale in (("epoch-", steps_per_epoch), ("step-", 1)):
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            return int(name[len(prefix) :]) * scale
    return None


def backup_name(step: int, steps_per_epoch: int) -> str:
    """``epoch-N`` at an epoch's end, else ``step-T``."""
    return f"epoch-{step // steps_per_epoch}" if step % steps_per_epoch == 0 else f"step-{step}"


def _backups(task_dir: str, steps_per_epoch: int) -> Dict[int, str]:
    """Global step -> directory name of the complete backups in ``task_dir``."""
    try:
        names = os.listdir(task_dir)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    found = {backup_step(n, steps_per_epoch): n for n in names}
    found.pop(None, None)
    return found  # type: ignore[return-value]


def resume_point(backup_dir: str, tasks: List[str], steps_per_epoch: int) -> Tuple[int, Optional[str]]:
    """(the last global step every task has a complete backup of, its directory name); (0, None): start
    afresh."""
    per_task = [_backups(os.path.join(backup_dir, t), steps_per_epoch) for t in tasks]
    common = set.intersection(*(set(b) for b in per_task)) if per_task else set()
    if not common:
        return 0, None
    step = max(common)
    return step, per_task[0][step]


def resume_epoch(backup_dir: str, tasks: List[str]) -> int:
    """The last epoch every task has an end-of-epoch backup of (0: start afresh)."""
    per_task = [
        {s for s, n in _backups(os.path.join(backup_dir, t), 1).items() if n.startswith("epoch-")}
        for t in tasks
    ]
    common = set.intersection(*per_task) if per_task else set()
    return max(common, default=0)


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


def save_backup(model: Any, task_dir: str, name: str, steps_per_epoch: int, hold: Any = None) -> None:
    """Save ``model`` (``save_weights``: a SkipCorrectStrategy averages first) to ``task_dir/name``
    through a temporary directory renamed at the end; keep the last :data:`KEEP` backups. ``hold(tmp)``
    runs between the write and the rename (the chaos tests' hook)."""
    from tf_commopt._compat import refresh_checkpoint_children

    tmp, final = os.path.join(task_dir, f".tmp-{name}"), os.path.join(task_dir, name)
    shutil.rmtree(tmp, ignore_errors=True)
    if getattr(model, "optimizer", None) is not None:
        refresh_checkpoint_children(model.optimizer)  # after a resume: children tracked since (the state)
    model.save_weights(os.path.join(tmp, "ckpt"))
    if hold is not None:
        hold(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    kept = _backups(task_dir, steps_per_epoch)
    for step in sorted(kept)[:-KEEP]:
        shutil.rmtree(os.path.join(task_dir, kept[step]), ignore_errors=True)


def backup_tasks(tfc: Any, multi: bool, backup_dir: str) -> Tuple[List[str], str]:
    """Every task's backup name and this task's backup directory (``local`` without a cluster)."""
    if not multi:
        return ["local"], os.path.join(backup_dir, "local")
    tasks = [f"{t}-{i}" for t in ("chief", "worker") for i in range(len(tfc.cluster.get(t, [])))]
    return tasks, os.path.join(backup_dir, f"{tfc.task_type}-{tfc.task_index}")


def resolve_backup_dir(given: str, environ: Mapping[str, str], err: Optional[TextIO] = None) -> str:
    """``--backup_dir``, else the launcher's temporary one when it restarts the job (said on stderr)."""
    if given:
        return given
    made = launcher_backup_dir(environ)
    if made:
        print(
            f"no --backup_dir: backing up to {made} (${BACKUP_DIR_ENV}, made by the launcher for restarts)",
            file=err or sys.stderr,
            flush=True,
        )
        return made
    return ""
