"""Runners and benchmarks, each run as ``python -m experiments.<name>``.

Importing the package selects tf-keras as ``tf.keras`` (:func:`tf_commopt.use_tf_keras`, the one place of
that rule) before any runner imports TensorFlow.
"""

from tf_commopt import use_tf_keras

use_tf_keras()
