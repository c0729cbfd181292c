"""What the benches that drive a shaped cluster share: run a command on every worker of a
``tf_commopt.cluster`` cluster and collect the JSON lines they print (no flags here, so any bench can
import it).

Example:
    >>> from experiments._bench import runner_result                               # doctest: +SKIP
    >>> r = runner_result(["--model=mlp", "--steps=50", "--strategy=skip_correct"], 2, 10.0, "switch")  # doctest: +SKIP
    >>> r["wall_s"], r["test_accuracy"]                                             # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, List, Optional

__all__ = ["ROOT", "cluster_results", "runner_result"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cluster_results(
    argv: List[str],
    workers: int,
    mbit: Optional[float] = None,
    topology: str = "switch",
    timeout: float = 900,
) -> List[Dict[str, Any]]:
    """Run ``argv`` on ``workers`` processes (shaped to ``mbit`` on ``topology`` when given) and return every
    ``RESULT {...}`` or ``{...}`` line they printed, each with its ``task``; RuntimeError with the tails if
    the cluster failed."""
    from tf_commopt.cluster import run_cluster

    r = run_cluster(
        argv,
        workers=workers,
        bandwidth_mbit=mbit,
        topology=topology,
        timeout=timeout,
        cwd=ROOT,
        env={"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ROOT},
        echo=False,
    )
    if r.returncode != 0:
        tail = "\n".join(f"[{t}] {x}" for t in r.outputs for x in r.last_lines(t, 8))
        raise RuntimeError(f"{r.message}\n{tail}")
    out = []
    for t in sorted(r.outputs):
        for line in r.outputs[t]:
            if line.startswith("RESULT "):
                out.append(dict(json.loads(line[7:]), task=t))
            elif line.startswith("{") and line.rstrip().endswith("}"):
                try:
                    out.append(dict(json.loads(line), task=t))
                except json.JSONDecodeError:
                    pass
    return out


def runner_result(extra: List[str], workers: int, mbit: float, topology: str) -> Dict[str, Any]:
    """``python -m experiments.train <extra>`` on the shaped cluster; the chief's JSON record."""
    res = cluster_results(
        [sys.executable, "-m", "experiments.train", *extra], workers, mbit, topology, timeout=1800
    )
    chief = [r for r in res if r["task"] == "worker:0" and "wall_s" in r]
    if not chief:
        raise RuntimeError("the runner printed no result")
    return chief[-1]
