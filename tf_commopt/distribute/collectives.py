"""The CommunicationOptions (and chunking) to give TensorFlow's collective all-reduce, from measurement.

Example:
    >>> from tf_commopt.distribute.collectives import recommended_options, recommended_chunks
    >>> opts = recommended_options(407_080)        # the mlp model's float32 weights
    >>> opts.bytes_per_pack, opts.implementation.name, recommended_chunks(407_080)
    (0, 'AUTO', 1)

    In a strategy's ``StrategyExtended`` (cross-replica context), one fused buffer per dtype::

        reduced = self.reduce_to(tf.distribute.ReduceOp.MEAN, value, destinations=value,
                                 options=recommended_options(payload_bytes))

Why TensorFlow's defaults (one fused collective per dtype, no chunking) are kept, with the
measurements, is in docs/architecture.md and docs/results/allreduce.md. ``timeout_seconds`` stays unset:
a sync over a slow link legitimately takes long, and MultiWorkerMirroredStrategy's heartbeats already
detect a dead peer.
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
