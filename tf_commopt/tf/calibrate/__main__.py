"""``python -m tf_commopt.tf.calibrate`` (see :mod:`tf_commopt.tf.calibrate.report`)."""

import sys

from tf_commopt.tf.calibrate.report import main

if __name__ == "__main__":
    sys.exit(main())
