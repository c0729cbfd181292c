"""Hold roofline estimates against the bundled H200 per-layer measurements.

* :mod:`~tf_commopt.tf.calibrate.estimate` — cost the profiles' own nodes with a roofline
  (:func:`estimate_profile`) and score it per layer (:func:`layer_errors`) and per pipeline stage
  (:func:`stage_errors`).
* :mod:`~tf_commopt.tf.calibrate.fit` — :func:`fit_roofline`: the effective peak, bandwidth, per-layer
  overhead and backward factor that fit given profiles best.
* :mod:`~tf_commopt.tf.calibrate.keras_apps` — the tf-keras applications of the same models, imported
  and held against the measurements (needs TensorFlow).
* :mod:`~tf_commopt.tf.calibrate.report` — ``python -m tf_commopt.tf.calibrate``: the tables of
  docs/results/calibration.md.

Example:
    >>> from tf_commopt.tf.calibrate import estimate_profile, layer_errors      # doctest: +SKIP
    >>> from tf_commopt.tf.devices import roofline_preset                        # doctest: +SKIP
    >>> est = estimate_profile("h200/resnet50.fp32", roofline_preset("h200")[0]) # doctest: +SKIP
    >>> layer_errors(est, load_profile("h200/resnet50.fp32"))["weighted"]        # doctest: +SKIP

Command line::

    python -m tf_commopt.tf.calibrate                      # leave-one-out fits, 4 stages, fp32 and bf16
    python -m tf_commopt.tf.calibrate --keras resnet50,vgg16   # + tf-keras imports (TensorFlow)
"""

from tf_commopt.tf.calibrate.estimate import (
    MODELS,
    MODES,
    estimate_profile,
    layer_cost,
    layer_errors,
    stage_errors,
)
from tf_commopt.tf.calibrate.fit import fit_roofline
from tf_commopt.tf.calibrate.keras_apps import KERAS_APPS, keras_application_totals, keras_stage_errors
from tf_commopt.tf.calibrate.report import main

__all__ = [
    "layer_cost",
    "estimate_profile",
    "layer_errors",
    "stage_errors",
    "fit_roofline",
    "keras_application_totals",
    "keras_stage_errors",
    "MODELS",
    "MODES",
    "KERAS_APPS",
    "main",
]
