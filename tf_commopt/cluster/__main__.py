"""``python -m tf_commopt.cluster [options] -- COMMAND [ARG ...]`` (see :mod:`tf_commopt.cluster.cli`)."""

import sys

from tf_commopt.cluster.cli import main

if __name__ == "__main__":
    sys.exit(main())
