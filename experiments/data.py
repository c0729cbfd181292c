"""Input pipelines shared by the runner and the benchmarks (no flags here, so any runner can import it).

Example:
    >>> from experiments.data import train_dataset_fn          # doctest: +SKIP
    >>> ds = strategy.distribute_datasets_from_function(
    ...     train_dataset_fn(x, y, global_batch=128, seed=0))   # doctest: +SKIP
"""

from __future__ import annotations


def train_dataset_fn(x, y, global_batch: int, seed: int, non_iid_classes: int = 0):
    """A ``distribute_datasets_from_function`` input function: each worker reads its own shard,
    shuffled (seeded) and repeated, in per-replica batches. With ``non_iid_classes > 0`` the shards
    are label-skewed (:func:`tf_commopt.datasets.split_non_iid`); otherwise element i goes to shard
    i mod N."""
    import tensorflow as tf

    from tf_commopt._compat import no_autotune
    from tf_commopt.datasets import split_non_iid

    def fn(ctx: tf.distribute.InputContext):
        if non_iid_classes:
            idx = split_non_iid(y, ctx.num_input_pipelines, non_iid_classes, seed=seed)[ctx.input_pipeline_id]
            ds = tf.data.Dataset.from_tensor_slices((x[idx], y[idx]))
        else:
            ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(
                ctx.num_input_pipelines, ctx.input_pipeline_id
            )
        ds = ds.shuffle(len(x), seed=seed, reshuffle_each_iteration=True).repeat()
        ds = ds.batch(ctx.get_per_replica_batch_size(global_batch), drop_remainder=True).prefetch(2)
        return no_autotune(ds)  # nothing to tune; its autotune thread can stall the iterator's deletion

    return fn
