"""The pure core never imports TensorFlow (checked in process: tf_commopt is imported afresh with
TensorFlow, tf-keras and Keras blocked, even when another test loaded them)."""

import importlib
import pkgutil

from tests.inprocess import fresh_imports


def test_core_does_not_import_tensorflow():
    with fresh_imports() as seen:  # raises BlockedImport naming what was tried
        import tf_commopt.core

        for m in pkgutil.walk_packages(tf_commopt.core.__path__, "tf_commopt.core."):
            importlib.import_module(m.name)
        import tf_commopt.datasets
        import tf_commopt.errors
    assert "tf_commopt.core.simulate" in seen and "tf_commopt.datasets" in seen
