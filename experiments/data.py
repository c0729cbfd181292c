"""Input pipelines shared by the runner and the benchmarks (no flags here, so any runner can import it).

Example:
    >>> from experiments.data import train_dataset_fn          # doctest: +SKIP
    >>> ds = strategy.distribute_datasets_from_function(
    ...     train_dataset_fn(x, y, global_batch=128, seed=0))   # doctest: +SKIP
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

from tf_commopt.errors import InputError

FLAG = "--batch_shares"


def parse_batch_shares(text: str, where: str = FLAG) -> Optional[Tuple[float, ...]]:
    """``"1,0.5,1,0.5"`` -> (1.0, 0.5, 1.0, 0.5): one positive share per worker (None for "").

    >>> parse_batch_shares(""), parse_batch_shares("2, 1")
    (None, (2.0, 1.0))
    >>> parse_batch_shares("1,0")
    Traceback (most recent call last):
    ...
    tf_commopt.errors.InputError: --batch_shares: item '0': a share must be a finite number > 0
    """
    if not (text or "").strip():
        return None
    out = []
    for item in text.split(","):
        try:
            v = float(item)
        except ValueError:
            v = math.nan
        if not (math.isfinite(v) and v > 0):
            raise InputError(f"item {item.strip()!r}: a share must be a finite number > 0", where=where)
        out.append(v)
    return tuple(out)


def share_batch(per_worker: int, shares: Sequence[float], worker: int) -> int:
    """Worker ``worker``'s batch: ``per_worker`` times its share over the largest (at least 1).

    >>> [share_batch(128, (1, 0.5, 1, 0.5), w) for w in range(4)]
    [128, 64, 128, 64]
    """
    return max(1, int(round(per_worker * shares[worker] / max(shares))))


def train_dataset_fn(
    x, y, global_batch: int, seed: int, non_iid_classes: int = 0, shares: Optional[Sequence[float]] = None
):
    """A ``distribute_datasets_from_function`` input function: each worker reads its own shard,
    shuffled (seeded) and repeated, in per-replica batches; element i goes to shard i mod N.

    With ``non_iid_classes > 0`` the shards are label-skewed (:func:`tf_commopt.datasets.split_non_iid`,
    each mostly holding that many labels): one per worker, or, where one input pipeline feeds several
    replicas (local replicas of one process), one per replica — the pipeline then yields the replicas'
    batches in turn, which the strategy hands out round robin.

    ``shares`` (one per worker, one replica each): worker i batches ``global_batch / workers`` times its
    share over the largest (:func:`share_batch`), so a worker half as fast reads half as many examples per
    step and every worker's step takes about as long.
    """
    import tensorflow as tf

    from tf_commopt.datasets import split_non_iid
    from tf_commopt.tf.input_teardown import no_autotune

    def fn(ctx: tf.distribute.InputContext):
        per_replica = ctx.get_per_replica_batch_size(global_batch)
        local = ctx.num_replicas_in_sync // ctx.num_input_pipelines
        if shares is not None:
            if local != 1 or len(shares) != ctx.num_input_pipelines:
                raise InputError(
                    f"names {len(shares)} shares for {ctx.num_input_pipelines} worker(s) of "
                    f"{ctx.num_replicas_in_sync} replica(s): give one per worker, one replica each",
                    where=FLAG,
                )
            per_replica = share_batch(per_replica, shares, ctx.input_pipeline_id)
        if non_iid_classes and local > 1:
            shards = split_non_iid(y, ctx.num_replicas_in_sync, non_iid_classes, seed=seed)
            mine = shards[ctx.input_pipeline_id * local : (ctx.input_pipeline_id + 1) * local]
            parts = [
                tf.data.Dataset.from_tensor_slices((x[idx], y[idx]))
                .shuffle(len(idx), seed=seed + i, reshuffle_each_iteration=True)
                .repeat()
                .batch(per_replica, drop_remainder=True)
                for i, idx in enumerate(mine)
            ]
            turns = tf.data.Dataset.range(local).repeat()
            return no_autotune(tf.data.Dataset.choose_from_datasets(parts, turns).prefetch(2))
        if non_iid_classes:
            idx = split_non_iid(y, ctx.num_input_pipelines, non_iid_classes, seed=seed)[ctx.input_pipeline_id]
            ds = tf.data.Dataset.from_tensor_slices((x[idx], y[idx]))
        else:
            ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(
                ctx.num_input_pipelines, ctx.input_pipeline_id
            )
        ds = ds.shuffle(len(x), seed=seed, reshuffle_each_iteration=True).repeat()
        ds = ds.batch(per_replica, drop_remainder=True).prefetch(2)
        return no_autotune(ds)  # nothing to tune; its autotune thread can stall the iterator's deletion

    return fn
