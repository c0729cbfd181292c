"""The CommunicationOptions (and chunking) to give TensorFlow's collective all-reduce, from measurement.

Example:
    >>> from tf_commopt.distribute.collectives import recommended_options, recommended_chunks
    >>> opts = recommended_options(407_080)        # the mlp model's float32 weights
    >>> opts.bytes_per_pack, opts.implementation.name, recommended_chunks(407_080)
    (0, 'AUTO', 1)

    In a strategy's ``StrategyExtended`` (cross-replica context), one fused buffer per dtype::

        reduced = self.reduce_to(tf.distribute.ReduceOp.MEAN, value, destinations=value,
                                 options=recommended_options(payload_bytes))

What was measured (``experiments/allreduce_bench.py``; every figure and command in
docs/results/allreduce.md). MultiWorkerMirroredStrategy on CPU, one process per worker, TF's gRPC ring,
``tf_commopt.cluster`` tbf shaping; the settings interleaved, a barrier and an idle gap before each timed
all-reduce, the slowest rank's time, medians over repeats, several runs per configuration:

* 4 workers, one shared 1 Gbit/s segment, 40 MB: TF's defaults took 2.042-2.056 s = 1.06-1.07 x the ring
  bound 2(N-1) B 8 / R = 1.92 s, i.e. at the TCP wire floor (1514 wire bytes per 1448 payload bytes plus
  the ACKs: ~1.068 x) and level with the 2.06 s PyTorch gloo figure of issue 12. The best alternative,
  8 packs of 5 MB, won in 5 of 5 runs by 0.3-1.1 %; RING, chunks in one pack, 1/16 MiB packs: +-1 %.
  (The 2.56 s in issue 12 did not reproduce: 2.05 s with the old shaping too.)
* 4 workers, shared 1 Gbit/s, 0.4 MB (the mlp model): one collective 27 ms; 2 packs 28 ms; 4 packs
  35-38 ms; 16 packs 97-115 ms. Packs run one after another (TF orders collectives with an ordering
  token), each paying 2(N-1) RPC round trips.
* 2 workers, switch 10 Mbit/s per link, 0.4 MB: every setting's minimum is ~0.35 s (1.07 x the 0.326 s
  bound); one buffer has a tail (medians 0.373-0.395 s in 7 runs) that 2 or 4 packs avoid (0.349-0.353 s,
  -6 to -11 %), with far fewer TCP retransmissions. It depends on the emulated switch's buffer: with a
  16 KiB queue one buffer won (0.364 vs 0.373 s).
* AUTO and RING measured the same: TF 2.21 registers two all-reduce implementations, ``RingReduce`` and
  ``NcclReduce`` (GPU only), so on CPU AUTO is the ring. AUTO is kept so that GPU clusters can get NCCL.

Hence: ``CommunicationOptions(implementation=AUTO, bytes_per_pack=0)`` — one fused collective per dtype,
exactly TF's defaults — and no chunking, for every payload measured (0.2 MB to 40 MB): already at the
wire floor for large payloads; the slow-link gain of 2 packs is queue-dependent and costs on fast links.
``timeout_seconds`` stays unset: a sync over a slow link legitimately takes long (40 MB over 4 ranks at
10 Mbit/s per link: >= 48 s), and MultiWorkerMirroredStrategy's heartbeats already detect a dead peer.
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
        bytes_per_pack=0, implementation=tf.distribute.experimental.CommunicationImplementation.AUTO
    )


def recommended_chunks(payload_bytes: int) -> int:
    """How many equal pieces to split a fused buffer of ``payload_bytes`` into before the all-reduce: 1.

    Splitting never measured better than the wire floor one buffer already reaches for large payloads,
    and each extra collective costs a few ms of ring round trips for small ones (module docstring).

    >>> recommended_chunks(407_080), recommended_chunks(40_000_000)
    (1, 1)
    """
    _check_payload(payload_bytes)
    return 1
