"""Every docstring example of the experiments/ modules that need no TensorFlow runs and holds."""

import doctest
import importlib

import pytest

MODULES = [
    "experiments._cli",
    "experiments.config",
    "experiments.page",
    "experiments.report",
    "experiments.harness",
    "experiments.record",
    "experiments.optimizers",
    "experiments.collective",
    "experiments.backup",
    "experiments.resume",
    "experiments.ps_train",
    "experiments.allreduce",
    "experiments.allreduce_bench",
    "experiments.comm_bench",
    "experiments.sim_pages",
    "experiments.calibration_page",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(
        importlib.import_module(name), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    assert (
        result.failed == 0 and result.attempted > 0 or name in ("experiments.report", "experiments.harness")
    )
