"""Skip really skips: on a 2-worker cluster, the step functions of model.fit and of a custom loop execute
no collective at all on non-sync steps (counted from the ops TensorFlow's debugger saw execute, not from
the traced graph), and do on the sync step."""

import json
import os
import sys

from tf_commopt.cluster import run_cluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_no_collective_executes_between_syncs(tmp_path):
    r = run_cluster(
        [sys.executable, os.path.join(ROOT, "tests", "cluster", "_collectives_worker.py"), str(tmp_path)],
        workers=2,
        timeout=300,
        env={"TF_CPP_MIN_LOG_LEVEL": "2"},
        cwd=ROOT,
        echo=False,
    )
    tail = "\n".join(f"[{t}] {line}" for t in r.outputs for line in r.last_lines(t, 20))
    assert r.returncode == 0, f"{r.message}\n{tail}"
    per_worker = []
    for w in range(2):
        stages = {
            d["stage"]: d for d in (json.loads(x) for x in r.outputs[f"worker:{w}"] if x.startswith("{"))
        }
        per_worker.append(stages)
        assert set(stages) == {
            "fit_local_1",
            "fit_sync",
            "fit_local_2",
            "custom_sync_1",
            "custom_local_1",
            "custom_sync_2",
            "custom_local_2",
        }, stages
        for name in ("fit_local_1", "fit_local_2", "custom_local_1", "custom_local_2"):
            assert stages[name]["collectives"] == {}, (w, name, stages[name])
        # the sync step: the fused all-reduce of the model (metrics stay local inside the step functions)
        for name in ("fit_sync", "custom_sync_1", "custom_sync_2"):  # one fused all-reduce (one dtype)
            assert stages[name]["collectives"] == {"CollectiveReduceV2": 1}, (w, name, stages[name])
        order = (
            "fit_local_1",
            "fit_sync",
            "fit_local_2",
            "custom_sync_1",
            "custom_local_1",
            "custom_sync_2",
            "custom_local_2",
        )
        assert [stages[s]["syncs"] for s in order] == [0, 1, 1, 2, 2, 3, 3]
    # the epoch's loss and accuracy Keras returns are global: the same on both workers (their data differ)
    for name in ("fit_local_1", "fit_sync", "fit_local_2"):
        assert per_worker[0][name]["history"] == per_worker[1][name]["history"], name
