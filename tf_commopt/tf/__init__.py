"""TensorFlow glue: cost graphs from Keras models and exported graphs, measured costs, slow devices.

The submodules import TensorFlow; names here load on first use.

Example:
    >>> from tf_commopt.tf import from_keras_model, profile_keras_model    # doctest: +SKIP
    >>> g = from_keras_model(model, batch_size=32)                         # estimated (roofline)
    >>> m = profile_keras_model(model, batch_size=32, device="/CPU:0")     # measured

Modules: :mod:`~tf_commopt.tf.graph_import` (the importers), :mod:`~tf_commopt.tf.keras_walk`
(Keras layer graph), :mod:`~tf_commopt.tf.op_graph` (GraphDef to op/scope DAG),
:mod:`~tf_commopt.tf.op_costs` (FLOPs, bytes, roofline), :mod:`~tf_commopt.tf.profiler`
(timing, capacities), :mod:`~tf_commopt.tf.slowdown` (emulated slow devices),
:mod:`~tf_commopt.tf.model_files` (SavedModel, .keras/.h5, CLI loading), :mod:`~tf_commopt.tf.file_kinds`
(what a file is), :mod:`~tf_commopt.tf.train_graph` (gradient/optimizer ops of training steps),
:mod:`~tf_commopt.tf.devices` (roofline presets), :mod:`~tf_commopt.tf.calibrate` (vs the H200 profiles),
:mod:`~tf_commopt.tf.stage_use` (idle stages, break-even bandwidth; pure Python),
:mod:`~tf_commopt.tf.input_teardown` (tf.data autotuning off: iterators deleted at once).
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "from_keras_model": "graph_import",
    "from_concrete_function": "graph_import",
    "from_graph_def": "graph_import",
    "from_graphdef_file": "graph_import",
    "read_graphdef": "graph_import",
    "from_saved_model": "model_files",
    "from_model_file": "model_files",
    "load_graph": "model_files",
    "roofline_preset": "devices",
    "DEVICE_PRESETS": "devices",
    "Roofline": "op_costs",
    "PRESETS": "op_costs",
    "CostEstimateWarning": "op_costs",
    "profile_keras_model": "profiler",
    "device_capacity": "profiler",
    "relative_capacities": "profiler",
    "measure_roofline": "profiler",
    "time_keras_model": "profiler",
    "model_capacities": "profiler",
    "slowed": "slowdown",
    "set_slowdown": "slowdown",
    "get_slowdown": "slowdown",
    "clear_slowdowns": "slowdown",
    "slowdowns": "slowdown",
    "no_autotune": "input_teardown",
    "device_iterators_without_autotune": "input_teardown",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"tf_commopt.tf.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'tf_commopt.tf' has no attribute {name!r}")
