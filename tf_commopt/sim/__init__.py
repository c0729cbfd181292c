"""Command-line pipeline simulator: ``python -m tf_commopt.sim`` (see :mod:`tf_commopt.sim.cli`).

Pure: imports no TensorFlow (matplotlib only when ``--png`` is given).

Example:
    >>> from tf_commopt.sim import main   # doctest: +SKIP
    >>> main(["--profile", "pipedream/vgg16", "--plan", "plan.json", "--schedule", "gpipe",
    ...       "--microbatches", "8"])     # doctest: +SKIP
"""

from tf_commopt.sim.cli import build_parser, main

__all__ = ["main", "build_parser"]
