"""Entry point of ``python -m tf_commopt.sim`` (see :mod:`tf_commopt.sim.cli`)."""

import sys

from tf_commopt.sim.cli import main

if __name__ == "__main__":
    sys.exit(main())
