"""What a round's closure reads: the batch of (shard i, step t), fixed whoever runs the shard.

A *source* has ``open(shard, step0) -> next_batch(j)`` (called while the closure is traced; ``j`` is the
local step, so the batch is the one of global step ``step0 + j``) and a ``per_shard`` flag: True when
``shard`` must be a Python int (one traced closure per shard), False when it may be a tensor (one
closure for every shard). Because a batch depends on (shard, step) only, a closure that TensorFlow
re-runs on another worker after a failure reads the same batches.

Example:
    >>> import numpy as np
    >>> fn = array_batch_fn(np.arange(8.0)[:, None], np.arange(8), num_shards=2, batch_size=2)
    >>> [int(v) for v in fn(1, 0)[1]]        # shard 1 = rows 1, 3, 5, 7; step 0 = its rows 0, 1
    [1, 3]
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from tf_commopt.errors import InputError

__all__ = ["array_batch_fn", "BatchFnSource", "DatasetFnSource", "as_source"]


def _shard_rows(x, y, num_shards: int, batch_size: int, shard_indices) -> tuple:
    """(xs, ys, n): the rows of each shard stacked ([K, n, ...]), cut to the shortest shard's n rows."""
    x, y = np.asarray(x), np.asarray(y)
    if len(x) != len(y):
        raise InputError(f"x has {len(x)} rows but y has {len(y)}", where="array_batch_fn")
    if not isinstance(num_shards, int) or num_shards < 1 or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(
            f"num_shards and batch_size must be positive integers, got {num_shards!r}, {batch_size!r}",
            where="array_batch_fn",
        )
    if shard_indices is None:
        shard_indices = [np.arange(i, len(x), num_shards) for i in range(num_shards)]
    elif len(shard_indices) != num_shards:
        raise InputError(
            f"shard_indices has {len(shard_indices)} shards, num_shards is {num_shards}",
            where="array_batch_fn",
        )
    n = min(len(ix) for ix in shard_indices)
    if n < 1:
        raise InputError(f"{len(x)} rows cannot fill {num_shards} shards", where="array_batch_fn")
    xs = np.stack([x[np.asarray(ix)[:n]] for ix in shard_indices])
    ys = np.stack([y[np.asarray(ix)[:n]] for ix in shard_indices])
    return xs, ys, n


def array_batch_fn(
    x: np.ndarray,
    y: np.ndarray,
    num_shards: int,
    batch_size: int,
    shard_indices: Optional[Sequence[Sequence[int]]] = None,
) -> Callable:
    """A ``batch_fn(shard, step) -> (x, y)`` over in-memory arrays, evaluated on the worker.

    Shard i holds rows i, i + K, i + 2K, ... (K = ``num_shards``), or the rows ``shard_indices[i]``
    in that order (e.g. a label-skewed split; every shard is cut to the shortest one's length n);
    step t (0-based, counted over rounds) of shard i takes its rows (t B .. t B + B - 1) mod n.
    The arrays become constants of the round function (shipped to each worker once, with the
    function), so this is for data sets of up to a few hundred MB; pass your own ``batch_fn``
    (e.g. reading files on the worker) for larger ones.

    Args:
        x, y: inputs and labels, the same number of rows.
        num_shards: K.
        batch_size: B, rows per shard and step.
        shard_indices: the rows of each shard (default: round robin).

    Example:
        >>> fn = array_batch_fn(np.zeros((8, 1)), np.arange(8), num_shards=2, batch_size=2)
        >>> [int(v) for v in fn(0, 3)[1]]        # shard 0 = rows 0, 2, 4, 6; step 3 wraps
        [4, 6]
    """
    xs, ys, n = _shard_rows(x, y, num_shards, batch_size, shard_indices)
    consts: List[Any] = [None, None, None]  # (graph, x, y) of the function being traced

    def batch_fn(shard, step):
        graph = tf.compat.v1.get_default_graph()
        if consts[0] is not graph:  # one copy per traced function, however many local steps use it
            consts[:] = [graph, tf.constant(xs), tf.constant(ys)]  # traced in: shipped with the function
        cx, cy = consts[1], consts[2]
        rows = tf.math.floormod(
            tf.cast(step, tf.int64) * batch_size + tf.range(batch_size, dtype=tf.int64), n
        )
        return tf.gather(cx[shard], rows), tf.gather(cy[shard], rows)

    batch_fn.num_shards = num_shards  # type: ignore[attr-defined]
    return batch_fn


class BatchFnSource:
    """Batches from a ``batch_fn(shard, step) -> (x, y)``: step t of shard i is fixed, whoever runs it.

    Example:
        >>> src = BatchFnSource(array_batch_fn(np.zeros((4, 1)), np.arange(4), 2, 1))
        >>> src.num_shards, src.per_shard
        (2, False)
    """

    per_shard = False  # one closure for every shard (the shard is a tensor argument)

    def __init__(self, batch_fn: Callable) -> None:
        self.batch_fn = batch_fn
        self.num_shards = getattr(batch_fn, "num_shards", None)

    def open(self, shard: Any, step0: Any) -> Callable:
        """``next_batch(j)``: the batch of local step j of a round that starts at global step ``step0``."""
        return lambda j: self.batch_fn(shard, step0 + tf.cast(j, tf.int64))


class DatasetFnSource:
    """Batches of shard i from ``dataset_fn(InputContext(K, i, K))``, built inside the closure.

    Step t of shard i is the dataset's element t (the closure ``skip``s the steps done), so the batches
    do not depend on which worker runs the shard. Elements must be ``(x, y)``; the dataset must not end.
    A ``dataset_fn(input_context, step)`` (two parameters) gets the shard's step (an int64 tensor) and
    returns the dataset from that step on: nothing is skipped.

    Example:
        >>> src = DatasetFnSource(lambda ctx: None, num_shards=2)
        >>> src.per_shard, src.takes_step
        (True, False)
    """

    per_shard = True  # one closure per shard: the InputContext holds a Python int

    def __init__(self, dataset_fn: Callable, num_shards: int) -> None:
        self.dataset_fn, self.num_shards = dataset_fn, int(num_shards)
        self.takes_step = _takes_step(dataset_fn)

    def _dataset(self, shard: int, step0: Any) -> tf.data.Dataset:
        k = self.num_shards
        ctx = tf.distribute.InputContext(
            num_input_pipelines=k, input_pipeline_id=int(shard), num_replicas_in_sync=k
        )
        ds = self.dataset_fn(ctx, step0) if self.takes_step else self.dataset_fn(ctx)
        if not isinstance(ds, tf.data.Dataset):
            raise InputError(f"dataset_fn must return a tf.data.Dataset, got {type(ds).__name__}", where="x")
        spec = ds.element_spec
        if not (isinstance(spec, tuple) and len(spec) == 2):
            raise InputError(f"dataset_fn's dataset must yield (x, y) pairs, got elements {spec}", where="x")
        return ds if self.takes_step else ds.skip(step0)

    def open(self, shard: int, step0: Any) -> Callable:
        """``next_batch(j)``: the next element of shard ``shard``'s dataset from global step ``step0`` on."""
        it = iter(self._dataset(shard, step0))
        ended = (
            f"dataset_fn's dataset of shard {shard} ended; make it infinite with .repeat() "
            "(steps_per_epoch counts the steps)"
        )

        def next_batch(j):
            opt = it.get_next_as_optional()
            with tf.control_dependencies([tf.debugging.Assert(opt.has_value(), [ended])]):
                bx, by = opt.get_value()
            return bx, by

        return next_batch


def _takes_step(fn: Callable) -> bool:
    """Whether ``fn`` is ``dataset_fn(input_context, step)`` (two positional parameters, no ``*args``)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return False  # e.g. a DatasetCreator(*args, **kwargs): the one-argument form
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2


def as_source(batch_fn: Any) -> Any:
    """``batch_fn`` itself if it is a source (has ``open``), else a :class:`BatchFnSource` around it.

    Example:
        >>> isinstance(as_source(lambda shard, step: None), BatchFnSource)
        True
    """
    return batch_fn if hasattr(batch_fn, "open") else BatchFnSource(batch_fn)
