"""The pure core never imports TensorFlow."""

import subprocess
import sys


def test_core_does_not_import_tensorflow():
    code = (
        "import sys, pkgutil, importlib, tf_commopt, tf_commopt.core\n"
        "for m in pkgutil.walk_packages(tf_commopt.core.__path__, 'tf_commopt.core.'):\n"
        "    importlib.import_module(m.name)\n"
        "import tf_commopt.datasets, tf_commopt.errors\n"
        "print('tensorflow' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
