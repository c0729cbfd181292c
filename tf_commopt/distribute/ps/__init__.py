"""Skip-and-correct on a TensorFlow parameter-server cluster (TF_CONFIG with ``chief``, ``worker``, ``ps``).

Example (the same script runs on every task; docs/parameter_server.md)::

    from tf_commopt.distribute import ps
    ps.serve_unless_chief()                        # worker and ps tasks serve here, exit with the chief
    trainer = ps.ParameterServerSkipCorrect(interval="auto")
    with trainer.scope():                          # variables live on the ps tasks
        model = tf_keras.Sequential([...])
        model.compile(optimizer=tf_keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    ps.wrap(model)                                 # this model's fit runs skip-and-correct rounds
    model.fit(x, y, batch_size=64, epochs=3)

Modules: ``trainer`` (``ParameterServerSkipCorrect``: rounds, counters, checkpoints), ``keras_fit``
(``fit``, ``wrap``, ``prepare``, ``chief_copy``), ``plan`` (which kind of round), ``closure`` (a
shard's H local steps on a worker), ``averaging`` (the ps side of a round), ``state`` (per-shard
variables on the ps), ``rules`` (tf-keras optimizers as tensor rules), ``forward`` (a Keras model run on
weight tensors), ``metrics`` (compiled loss and metrics as functions), ``data`` (batches of (shard,
step)), ``auto_interval`` (``interval="auto"``), ``failures`` and ``probe`` (lost tasks),
``checkpoints``, ``telemetry``, ``serve`` (worker and ps tasks).
"""

from __future__ import annotations

from tf_commopt import use_tf_keras

use_tf_keras()  # before TensorFlow loads: tf.keras is tf-keras under ParameterServerStrategy

from tf_commopt.distribute.correction import CORRECTIONS
from tf_commopt.distribute.ps.data import DatasetFnSource, array_batch_fn
from tf_commopt.distribute.ps.keras_fit import chief_copy, fit, prepare, wrap
from tf_commopt.distribute.ps.rules import SUPPORTED_OPTIMIZERS, UpdateRule, sgd_rule, update_rule
from tf_commopt.distribute.ps.serve import serve, serve_unless_chief
from tf_commopt.distribute.ps.trainer import ParameterServerSkipCorrect, trainer_for

__all__ = [
    "ParameterServerSkipCorrect",
    "serve",
    "serve_unless_chief",
    "fit",
    "wrap",
    "prepare",
    "chief_copy",
    "array_batch_fn",
    "DatasetFnSource",
    "trainer_for",
    "update_rule",
    "sgd_rule",
    "UpdateRule",
    "SUPPORTED_OPTIMIZERS",
    "CORRECTIONS",
]
