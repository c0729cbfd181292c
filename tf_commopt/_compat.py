"""The one place that touches TensorFlow and tf-keras internals (private modules and attributes).

Everything else in tf_commopt uses public TensorFlow API or imports from here. At import this module
checks the installed versions against the range it was written and tested for and fails with a
one-line error naming that range (override with ``TF_COMMOPT_SKIP_VERSION_CHECK=1`` at your own risk).
``tests/tf/test_compat.py`` enumerates every internal listed in :data:`INTERNALS` and fails loudly
when one is missing, so a TensorFlow upgrade breaks one test, not a training run.

Example:
    >>> from tf_commopt import _compat          # doctest: +SKIP
    >>> _compat.check_internals()               # doctest: +SKIP
    []
"""
from __future__ import annotations

import os
from typing import Any, List, Tuple

import tensorflow as tf

from tf_commopt.errors import TfCommoptError

__all__ = ["SUPPORTED_TF", "INTERNALS", "check_internals", "host_variable", "values", "mirrored_strategy",
           "collective_all_reduce_strategy", "collective_util", "distribute_lib", "tfconfig_cluster_resolver",
           "resource_variable_ops", "save_context", "trackable_base"]

SUPPORTED_TF: Tuple[str, ...] = ("2.21",)
"""TensorFlow major.minor versions this release was tested with (tf-keras must match)."""


def _check_version() -> None:
    if os.environ.get("TF_COMMOPT_SKIP_VERSION_CHECK") == "1":
        return
    mm = ".".join(tf.__version__.split(".")[:2])
    if mm not in SUPPORTED_TF:
        raise TfCommoptError(f"tf_commopt supports TensorFlow {', '.join(SUPPORTED_TF)}.x (it relies on "
                             f"tf.distribute internals), found {tf.__version__}; install tensorflow=="
                             f"{SUPPORTED_TF[-1]}.* tf-keras=={SUPPORTED_TF[-1]}.* or set "
                             "TF_COMMOPT_SKIP_VERSION_CHECK=1")


_check_version()

# ---- private TensorFlow modules (tensorflow.python.*) -------------------------------------------------
from tensorflow.python.distribute import collective_all_reduce_strategy  # noqa: E402
from tensorflow.python.distribute import collective_util  # noqa: E402
from tensorflow.python.distribute import distribute_lib  # noqa: E402
from tensorflow.python.distribute import mirrored_strategy  # noqa: E402
from tensorflow.python.distribute import values  # noqa: E402
from tensorflow.python.distribute.cluster_resolver import tfconfig_cluster_resolver  # noqa: E402
from tensorflow.python.ops import resource_variable_ops  # noqa: E402
from tensorflow.python.saved_model import save_context  # noqa: E402
from tensorflow.python.trackable import base as trackable_base  # noqa: E402

# (object, attribute) pairs the package relies on; check_internals() verifies each exists
INTERNALS: List[Tuple[Any, str]] = [
    (values, "MirroredVariable"), (values, "SyncOnReadVariable"), (values, "DistributedValues"),
    (values, "DistributedVariable"), (values, "PerReplica"),
    (values.MirroredVariable, "_get_cross_replica"),
    (mirrored_strategy, "MirroredExtended"), (collective_all_reduce_strategy, "CollectiveAllReduceExtended"),
    (collective_all_reduce_strategy.CollectiveAllReduceExtended, "_reduce"),
    (mirrored_strategy.MirroredExtended, "_reduce_to"), (mirrored_strategy.MirroredExtended, "_create_variable"),
    (collective_all_reduce_strategy.CollectiveAllReduceExtended, "_create_variable"),
    (collective_util, "Options"), (distribute_lib, "Strategy"),
    (tfconfig_cluster_resolver, "TFConfigClusterResolver"),
    (resource_variable_ops, "ResourceVariable"), (save_context, "in_save_context"),
    (trackable_base, "Trackable"), (trackable_base.Trackable, "_serialize_to_tensors"),
]


def check_internals() -> List[str]:
    """Names of the internals in :data:`INTERNALS` that this TensorFlow lacks (empty when all is well)."""
    missing = []
    for obj, attr in INTERNALS:
        if not hasattr(obj, attr):
            missing.append(f"{getattr(obj, '__name__', obj)}.{attr}")
    return missing


def host_variable(value: Any, dtype: tf.DType, name: str) -> tf.Variable:
    """A plain (non-distributed) variable on the host CPU, created outside any strategy's creator.

    >>> v = host_variable(0, tf.int64, "steps")   # doctest: +SKIP
    """
    with tf.init_scope(), tf.device("/CPU:0"):
        return resource_variable_ops.ResourceVariable(tf.constant(value, dtype), name=name, trainable=False)


# ---- collective keys ------------------------------------------------------------------------------------
_KEY_BASES = {"next": 0}


def next_collective_key_base() -> int:
    """A collective-key base no other strategy of this process uses (the one allocator of the package).

    Two strategies over overlapping devices in one process otherwise both start at group key 1 and the
    second one's collectives abort ("joining a group with size 2, but that group has size 4"); TensorFlow's
    own tests shift ``_collective_key_base`` per strategy. Every worker of a cluster that builds its
    strategies in the same order gets the same sequence.

    >>> a, b = next_collective_key_base(), next_collective_key_base()   # doctest: +SKIP
    >>> b - a                                                          # doctest: +SKIP
    100000
    """
    _KEY_BASES["next"] += 1
    return 10_000_000 + 100_000 * _KEY_BASES["next"]


def fresh_mirrored_strategy(devices: Any) -> tf.distribute.MirroredStrategy:
    """A ``tf.distribute.MirroredStrategy`` over ``devices`` with its own collective keys."""
    cls = tf.distribute.MirroredStrategy
    old = cls._collective_key_base
    cls._collective_key_base = next_collective_key_base()
    try:
        return cls(devices)
    finally:
        cls._collective_key_base = old
