"""Run ``tests/cluster/_worker.py`` on every task of a local cluster (``tf_commopt.cluster.run_cluster``),
keep the log tails for failures, parse the ``RESULT`` lines; compare recorded steps with a numpy rule.
(Test helpers; the shared clusters are fixtures in tests/cluster/conftest.py.)

Example:
    run = run_workers(tmp_path, ["auto"], bandwidth_mbit=20)
    first, second = run.results("auto")
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence

import numpy as np
import pytest

from tf_commopt.cluster import ClusterResult, run_cluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "cluster", "_worker.py")


def _value(v: Any) -> Any:
    if isinstance(v, list) and all(isinstance(x, (int, float, list)) for x in v):
        return np.asarray(v, dtype=np.float64)
    return v


@dataclass
class WorkerRun:
    """One run of the worker script on a cluster: its result, its directory, the files left in it."""

    result: ClusterResult
    out_dir: pathlib.Path
    files: List[str]  # paths under out_dir when the cluster ended (directories end with "/")

    def tail(self, n: int = 20) -> str:
        """The last ``n`` lines of every task, prefixed with the task's name."""
        r = self.result
        return "\n".join(f"[{t}] {line}" for t in r.outputs for line in r.last_lines(t, n))

    def results(self, scenario: str) -> List[Dict[str, Any]]:
        """The ``RESULT <scenario>`` of each worker (index order); fails with the log tails if missing."""
        got = []
        for task in sorted(self.result.outputs, key=lambda t: int(t.split(":")[1])):
            lines = [x for x in self.result.outputs[task] if x.startswith(f"RESULT {scenario} ")]
            if len(lines) != 1:
                pytest.fail(
                    f"{task}: no RESULT {scenario} ({self.result.message})\n{self.tail()}", pytrace=False
                )
            got.append({k: _value(v) for k, v in json.loads(lines[0].split(" ", 2)[2]).items()})
        return got


def run_workers(out_dir: pathlib.Path, scenarios: Sequence[str], workers: int = 2, **cluster) -> WorkerRun:
    """Run ``_worker.py OUT_DIR SCENARIO...`` on ``workers`` worker tasks (``cluster``: run_cluster's
    other arguments, e.g. ``bandwidth_mbit``). A failed run is returned too: each test that reads a
    missing RESULT fails with the tails."""
    cluster.setdefault("timeout", 600)
    r = run_cluster(
        [sys.executable, WORKER, str(out_dir), *scenarios],
        workers=workers,
        env={"TF_CPP_MIN_LOG_LEVEL": "2"},
        cwd=ROOT,
        echo=False,
        **cluster,
    )
    files = sorted(
        str(p.relative_to(out_dir)) + ("/" if p.is_dir() else "") for p in pathlib.Path(out_dir).rglob("*")
    )
    return WorkerRun(r, pathlib.Path(out_dir), files)


def assert_steps_follow(got: List[Dict[str, Any]], ref: Sequence[Any], steps: int) -> None:
    """Each worker's ``w``, ``b`` and ``Δ`` after each of ``steps`` steps equal the numpy rule's (``ref[t]``
    = (w_i, b_i, Δw_i) per replica i), and the workers' Δ sum to zero."""
    for t in range(steps):
        for i in range(len(got)):
            np.testing.assert_allclose(
                got[i]["w"][t], ref[t][0][i], rtol=1e-5, atol=1e-5, err_msg=f"step {t + 1} w{i}"
            )
            np.testing.assert_allclose(got[i]["b"][t], ref[t][1][i], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(got[i]["d"][t], ref[t][2][i], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(sum(g["d"][t] for g in got), 0.0, atol=1e-4)
