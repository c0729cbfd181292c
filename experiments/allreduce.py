"""``--bench_allreduce_mb``: time an all-reduce on the run's own strategy after training.

Example:
    >>> r = time_allreduce(strategy, megabytes=4, repeats=3)   # doctest: +SKIP  (every worker together)
    >>> sorted(r)                                               # doctest: +SKIP
    ['allreduce_busbw_mbit', 'allreduce_mb', 'allreduce_s']
"""

from __future__ import annotations

import time
from typing import Dict

__all__ = ["time_allreduce"]


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
