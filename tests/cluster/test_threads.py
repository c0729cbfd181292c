"""The launcher gives each task its share of the cores (TensorFlow and OpenMP thread pools)."""

import sys

import pytest

from tf_commopt.cluster import run_cluster
from tf_commopt.errors import InputError
from tf_commopt.threads import THREAD_VARS, available_cores, thread_env

PRINT = [
    sys.executable,
    "-c",
    "import os; print(','.join(os.environ.get(v, '-') for v in "
    "('TF_NUM_INTRAOP_THREADS', 'TF_NUM_INTEROP_THREADS', 'OMP_NUM_THREADS')))",
]


def _env_seen(monkeypatch, **kw):
    for v in THREAD_VARS:
        monkeypatch.delenv(v, raising=False)
    r = run_cluster(PRINT, echo=False, **kw)
    assert r.returncode == 0, r.message
    return {t: lines[-1] for t, lines in r.outputs.items()}


def test_each_task_gets_its_share_of_the_cores(monkeypatch):
    share = max(1, available_cores() // 3)
    seen = _env_seen(monkeypatch, workers=2, chief=True)
    assert seen == {t: f"{share},{max(2, share)},{share}" for t in ("worker:0", "worker:1", "chief:0")}


def test_explicit_count_zero_and_caller_env(monkeypatch):
    assert set(_env_seen(monkeypatch, workers=2, threads_per_task=3).values()) == {"3,3,3"}
    assert set(_env_seen(monkeypatch, workers=2, threads_per_task=0).values()) == {"-,-,-"}
    # the caller's own setting wins
    half = max(1, available_cores() // 2)
    assert set(_env_seen(monkeypatch, workers=2, env={"TF_NUM_INTRAOP_THREADS": "5"}).values()) == {
        f"5,{max(2, half)},{half}"
    }


def test_thread_env_and_bad_values():
    assert thread_env(4, cores=2) == {
        "TF_NUM_INTRAOP_THREADS": "1",
        "TF_NUM_INTEROP_THREADS": "2",
        "OMP_NUM_THREADS": "1",
    }
    assert thread_env(3, cores=16) == {v: "5" for v in THREAD_VARS}
    for bad in (-1, 1.5, True):
        with pytest.raises(InputError, match="threads_per_task"):
            run_cluster(PRINT, workers=1, threads_per_task=bad, echo=False)
