"""The CommunicationOptions (and chunking) to give TensorFlow's collective all-reduce, from measurement.

Example:
    >>> from tf_commopt.distribute.collectives import recommended_options, recommended_chunks
    >>> opts = recommended_options(407_080)        # the mlp model's float32 weights
    >>> opts.bytes_per_pack, opts.implementation.name, recommended_chunks(407_080)
    (0, 'AUTO', 1)

    In a strategy's ``StrategyExtended`` (cross-replica context), one fused buffer per dtype::

        reduced = self.reduce_to(tf.distribute.ReduceOp.MEAN, value, destinations=value,
                                 options=recommended_options(payload_bytes))

What was measured (``experiments/allreduce_bench.py``, docs/results/allreduce.md; MultiWorkerMirroredStrategy
on CPU, one process per worker, TF's gRPC ring, ``tf_commopt.cluster`` tbf shaping; every setting interleaved
with the others, a barrier and an idle gap before each timed all-reduce, the slowest rank's time, medians):

* 4 workers, one shared 1 Gbit/s segment, 40 MB: every setting took 2.03-2.06 s = 1.06-1.07 x the ring
  bound 2(N-1) B 8 / R = 1.92 s, i.e. at the wire floor (TCP/IP/Ethernet headers and ACKs add ~7 %: 1514
  wire bytes per 1448 payload bytes plus one 66-byte ACK per two segments). AUTO vs RING, one buffer vs 8
  or 32 chunks, ``bytes_per_pack`` 0 / 1 MB / 4 MB / 16 MB: all within +-1 %, the run-to-run noise. There
  is nothing left to win by options here; the 2.56 s in issue 12 did not reproduce (2.05 s with the old
  256 KiB/64 MB shaping too, 2.10 s timed back to back without a barrier).
* 4 workers, shared 1 Gbit/s, 0.4 MB (the mlp model): one collective 27 ms; 4 packs 37 ms; 16 packs
  115 ms. Packs run one after another (TF orders collectives with an ordering token) and each costs a
  few ms of ring round trips, so splitting small payloads on fast links is clearly worse.
* 2 workers, switch 10 Mbit/s per link, 0.4 MB: one collective 0.35-0.49 s (median ~0.39 s, 1.20 x the
  (N-1)/N 2 B 8 / R = 0.326 s bound); 2-4 packs of 100-200 kB: median 0.35 s (1.08 x) with the launcher's
  100 ms queue, but with a 16 KiB queue the order flipped (one collective 0.364 s, 2 packs 0.373 s). The
  minimum of every setting is the same 0.35 s (the wire floor); what differs is a tail from TCP/gRPC
  flow-control dynamics behind a queue, which depends on the queue, not on the options. Not robust enough
  to recommend, and it costs ~10 ms per extra pack on fast links (above).
* AUTO and RING measured the same everywhere (2.056 vs 2.036 s, 0.392 vs 0.388 s): TF 2.21 registers
  two all-reduce implementations, ``RingReduce`` and ``NcclReduce`` (GPU only), so on CPU AUTO is the
  ring. AUTO is kept so that GPU clusters can get NCCL.

Hence: ``CommunicationOptions(implementation=AUTO, bytes_per_pack=0)`` — one fused collective per dtype,
exactly TF's defaults — and no chunking, for every payload size measured (0.2 MB to 40 MB).
``timeout_seconds`` stays unset: a sync over a slow link legitimately takes long (40 MB at 10 Mbit/s per
link and 4 ranks: > 48 s), and a dead peer is already detected by MultiWorkerMirroredStrategy's heartbeats.
"""
from __future__ import annotations

import tensorflow as tf

from tf_commopt.errors import InputError

__all__ = ["recommended_options", "recommended_chunks"]


def _check_payload(payload_bytes: int) -> int:
    if isinstance(payload_bytes, bool) or not isinstance(payload_bytes, int) or payload_bytes < 0:
        raise InputError(f"payload_bytes must be an integer >= 0, got {payload_bytes!r}")
    return payload_bytes


def recommended_options(payload_bytes: int) -> tf.distribute.experimental.CommunicationOptions:
    """The options for an all-reduce of ``payload_bytes`` bytes (see the module docstring for why).

    Example:
        >>> recommended_options(40_000_000).bytes_per_pack
        0

    Args:
        payload_bytes: bytes one rank contributes (all tensors of the sync together).

    Returns:
        ``CommunicationOptions(bytes_per_pack=0, implementation=AUTO)``: one collective for the whole
        payload (for a list of tensors TF concatenates them into one pack), TF's own algorithm choice.

    Raises:
        InputError: ``payload_bytes`` is not an integer >= 0.
    """
    _check_payload(payload_bytes)
    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=0, implementation=tf.distribute.experimental.CommunicationImplementation.AUTO)


def recommended_chunks(payload_bytes: int) -> int:
    """How many equal pieces to split a fused buffer of ``payload_bytes`` into before the all-reduce: 1.

    Splitting never measured better than the wire floor one buffer already reaches for large payloads,
    and each extra collective costs a few ms of ring round trips for small ones (module docstring).

    >>> recommended_chunks(407_080), recommended_chunks(40_000_000)
    (1, 1)
    """
    _check_payload(payload_bytes)
    return 1
