"""Shared test set-up: tier markers by folder, and the rules of the ``core`` tier enforced.

Tiers (pytest.ini): ``core`` (tests/core: pure Python, in process), ``tf`` (tests/tf: one process, 4
logical CPU devices, see tests/tf/conftest.py), ``cluster`` (tests/cluster: separate processes). Tests
marked ``bench`` (timings, printed, never asserted) run only when asked for: ``pytest -m bench -s -n 0``.
The suite runs on two pytest-xdist workers (pytest.ini); a module is the unit a worker takes (``-n 0``
runs everything in this process). A ``core`` test that starts a process fails (call the CLI's ``main(argv)`` or
``tests.inprocess.run_module`` instead), and so does one that imports TensorFlow when this process has not
loaded it (``pytest tests/core``; in a full run tests/core/test_purity.py and ``run_module`` check it).
"""

import functools
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
# numpy single-threaded in the test processes and every process they start: two test workers already
# fill two cores, and idle OpenBLAS threads spin (about 0.6 CPU s per TensorFlow process start)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

TIERS = ("core", "tf", "cluster")


# session fixtures of the tier conftests -> the one unit of work (pytest-xdist) of every test that uses them
SHARED = {"sc_cluster": "sc_cluster", "sc_cluster_again": "sc_cluster", "keras3_jobs": "keras3_jobs"}


@functools.lru_cache(maxsize=None)
def unit_of(module: str) -> str:
    """The unit of work pytest-xdist hands to one worker for a test module (a path from the root): the
    module (its module fixtures are built once), or the ``SHARED`` session fixture its source names (built
    once for all the modules that use it)."""
    try:
        with open(os.path.join(ROOT, module), encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return module
    for name, unit in SHARED.items():
        if re.search(rf"\b{name}\b", text):
            return unit
    return module


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = str(item.fspath)
        for tier in TIERS:
            if f"{os.sep}tests{os.sep}{tier}{os.sep}" in path:
                item.add_marker(getattr(pytest.mark, tier))
        shared = [SHARED[n] for n in getattr(item, "fixturenames", ()) if n in SHARED]
        module = item.nodeid.split("::")[0]
        if shared and unit_of(module) != shared[0]:  # e.g. a fixture that uses a shared one, not named
            raise pytest.UsageError(f"{module}: uses {shared[0]!r}; name it in the module's source")
    if "bench" not in (config.option.markexpr or ""):  # timings run only when asked for: -m bench
        benches = [item for item in items if item.get_closest_marker("bench")]
        if benches:
            config.hook.pytest_deselected(items=benches)
            items[:] = [item for item in items if not item.get_closest_marker("bench")]


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist (``-n 2``, pytest.ini) schedules whole units (:func:`unit_of`), in collection order:
    the cluster tier, heaviest, first."""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid.split("::")[0])

    return UnitScheduling(config, log)


def _no_process(*args, **kwargs):
    raise RuntimeError(
        "the core tier starts no process: call main(argv) or tests.inprocess.run_module, "
        "or move the test to tests/cluster"
    )


@pytest.fixture(autouse=True)
def _core_tier_rules(request, monkeypatch):
    """In ``core`` tests: no subprocess, no fork, and no TensorFlow import (when not loaded already)."""
    if request.node.get_closest_marker("core") is None:
        yield
        return
    monkeypatch.setattr(subprocess.Popen, "_execute_child", _no_process)
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "execv", "execve"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, _no_process)
    from tests.inprocess import TENSORFLOW, _Blocker

    blocker = None
    if not any(m in sys.modules for m in TENSORFLOW):
        blocker = _Blocker(TENSORFLOW)
        sys.meta_path.insert(0, blocker)
    try:
        yield
    finally:
        if blocker is not None:
            sys.meta_path.remove(blocker)
    if blocker is not None and blocker.tried:
        pytest.fail(f"a core test imported {sorted(set(blocker.tried))}", pytrace=False)
