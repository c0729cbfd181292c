"""Every docstring example in the pure modules runs and holds."""

import doctest
import importlib
import pkgutil

import pytest

import tf_commopt
import tf_commopt.core

_PURE = [
    "tf_commopt",
    "tf_commopt.errors",
    "tf_commopt.datasets",
    "tf_commopt.threads",
    "tf_commopt._cli",
] + [m.name for m in pkgutil.walk_packages(tf_commopt.core.__path__, "tf_commopt.core.")]


@pytest.mark.parametrize("name", _PURE)
def test_docstring_examples(name):
    mod = importlib.import_module(name)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
