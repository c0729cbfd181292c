"""Graphs for the benchmarks: a bundled profile / file, or a tf-keras application.

Example:
    >>> from experiments.graphs import load_graph
    >>> load_graph("pipedream/resnet50").name        # doctest: +SKIP
    'resnet50'
    >>> g = load_graph("keras/ResNet50")              # doctest: +SKIP  (imports TensorFlow)
"""

from __future__ import annotations

import os

from tf_commopt.core.costgraph import CostGraph
from tf_commopt.core.profiles import load_profile
from tf_commopt.errors import InputError


def load_graph(name: str, where: str = "--profiles") -> CostGraph:
    """A bundled profile / file, or ``keras/<Application>``: a tf-keras application (weights=None)
    imported with ``tf_commopt.tf.graph_import.from_keras_model`` at batch 32 (roofline-estimated
    times, not measured; TensorFlow is imported only for these)."""
    if not name.startswith("keras/"):
        return load_profile(name)
    import warnings

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tf_keras as keras

    from tf_commopt.tf.graph_import import from_keras_model

    app_name = name.split("/", 1)[1]
    if not hasattr(keras.applications, app_name):
        raise InputError(f"unknown Keras application {app_name!r}", where=where)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = from_keras_model(getattr(keras.applications, app_name)(weights=None), batch_size=32)
    g.name = name
    return g
